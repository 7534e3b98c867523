// Reading a bad-input run: the fake NCCL's log cut into one segment per driver step, and the
// comparison of a step's segment with and without the shim.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "harness.h"

namespace itest {

// Lines of the fake's log after "marker step <step>" up to the next marker, without the fake
// CUDA driver's lines ("cuda ...") and with every unregistered non-NULL pointer written as
// "0x?" (a destroyed communicator's address differs from run to run).
std::map<std::string, std::vector<std::string>> step_segments(const RunResult& r);

// What NCCL received for one step with the shim (`got`) against without it (`want`): "" when
// identical, else the first difference. Lines of the shim's own communicator queries
// (ncclCommCount/UserRank/CuDevice, ncclGetVersion) that the baseline does not have at that
// point are skipped; every line of the application's own calls has to match.
std::string segment_difference(const std::vector<std::string>& want,
                               const std::vector<std::string>& got);

// The bad-input driver, and a run of it with FAKE_NCCL_CHECK_ARGS=1 plus `env`.
std::string bad_input_driver();
RunResult run_bad_input(const std::vector<std::string>& steps, bool preload,
                        const std::vector<std::pair<std::string, std::string>>& env,
                        const Scratch& scratch);

}  // namespace itest
