// The all-gather routing predicate (route.h): every combination of its inputs against the
// rules written out independently below, and the NCCL datatype sizes.
#include "route.h"

#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace {

using zc::AgRoute;
using zc::AllGatherMode;
using zc::RouteDecision;
using zc::RouteInputs;

const char* route_name(AgRoute r) {
  switch (r) {
    case AgRoute::kPassthrough:
      return "passthrough";
    case AgRoute::kCe:
      return "ce";
    case AgRoute::kNcclCe:
      return "nccl-ce";
    case AgRoute::kNcclStaged:
      return "nccl-staged";
  }
  return "?";
}

// The documented rules, as a decision list:
//  1. ZEROCTA_ALLGATHER=off: NCCL, always.
//  2. an op whose size is unknown (bad datatype / overflow) or empty: NCCL decides.
//  3. both buffers in windows the application registered: NCCL's own copy-engine path.
//  4. nccl without app windows: NCCL.
//  5. nccl-staged: through the pool (NCCL's CE all-gather inside it) with an agreed pool from
//     min_bytes up, whatever the communicator's size; else NCCL.
//  6. auto / zerocta: the copy engines only with an agreed pool; auto only from min_bytes up
//     and on communicators of at most auto_max_ranks ranks (0 = any), zerocta always. Graph capture
//     is not an input: it changes only which slots and streams the copy-engine route uses.
AgRoute expected_route(const RouteInputs& in) {
  if (in.mode == AllGatherMode::kOff) return AgRoute::kPassthrough;
  if (!in.bytes_valid || in.total_bytes == 0) return AgRoute::kPassthrough;
  if (in.app_windows) return AgRoute::kNcclCe;
  if (in.mode == AllGatherMode::kNcclStaged)
    return in.ce_ready && in.total_bytes >= in.min_bytes ? AgRoute::kNcclStaged
                                                         : AgRoute::kPassthrough;
  const bool ours = in.mode == AllGatherMode::kAuto || in.mode == AllGatherMode::kZerocta;
  if (!ours) return AgRoute::kPassthrough;
  const bool small_comm = in.auto_max_ranks == 0 || in.nranks <= in.auto_max_ranks;
  const bool big_enough =
      in.mode == AllGatherMode::kZerocta || (in.total_bytes >= in.min_bytes && small_comm);
  return in.ce_ready && big_enough ? AgRoute::kCe : AgRoute::kPassthrough;
}

constexpr AllGatherMode kModes[] = {AllGatherMode::kAuto, AllGatherMode::kZerocta,
                                    AllGatherMode::kNccl, AllGatherMode::kNcclStaged,
                                    AllGatherMode::kOff};
constexpr uint64_t kMin = 16ull << 20;

TEST(Route, TruthTable) {
  static const char kMissing[] = "the pool was not agreed (test reason)";
  int cases = 0;
  for (AllGatherMode mode : kModes)
    for (bool ce_ready : {false, true})
      for (uint64_t total : {uint64_t{0}, uint64_t{1}, kMin - 1, kMin, kMin + 1, UINT64_MAX})
        for (bool app_windows : {false, true})
          for (bool bytes_valid : {false, true})
            for (uint64_t nranks : {2, 3, 8})
              for (uint64_t max_ranks : {0, 2, 8}) {
                RouteInputs in;
                in.nranks = nranks;
                in.auto_max_ranks = max_ranks;
                in.mode = mode;
                in.ce_ready = ce_ready;
                in.ce_missing = kMissing;
                in.total_bytes = total;
                in.bytes_valid = bytes_valid;
                in.min_bytes = kMin;
                in.app_windows = app_windows;
                const RouteDecision d = zc::choose_allgather_route(in);
                const AgRoute want = expected_route(in);
                SCOPED_TRACE(std::string("mode ") + zc::to_string(mode) + " ce_ready " +
                             std::to_string(ce_ready) + " total " + std::to_string(total) +
                             " app_windows " + std::to_string(app_windows) + " bytes_valid " +
                             std::to_string(bytes_valid) + " nranks " + std::to_string(nranks) +
                             " auto_max_ranks " + std::to_string(max_ranks));
                EXPECT_EQ(route_name(d.route), std::string(route_name(want)));
                ASSERT_NE(d.why, nullptr);
                EXPECT_GT(strlen(d.why), 0u);
                // When the only obstacle is the missing pool, the log says why it is missing.
                RouteInputs ready = in;
                ready.ce_ready = true;
                const AgRoute with_pool = expected_route(ready);
                if (!ce_ready && (with_pool == AgRoute::kCe || with_pool == AgRoute::kNcclStaged)) {
                  EXPECT_STREQ(d.why, kMissing);
                }
                ++cases;
              }
  EXPECT_EQ(cases, 5 * 2 * 6 * 2 * 2 * 3 * 3);
}

TEST(Route, MinBytesBoundaryIsInclusiveForAuto) {
  RouteInputs in;
  in.mode = AllGatherMode::kAuto;
  in.ce_ready = true;
  in.min_bytes = 4096;
  in.total_bytes = 4095;
  EXPECT_EQ(zc::choose_allgather_route(in).route, AgRoute::kPassthrough);
  in.total_bytes = 4096;
  EXPECT_EQ(zc::choose_allgather_route(in).route, AgRoute::kCe);
  in.min_bytes = 0;  // ZEROCTA_MIN_BYTES=0: every non-empty all-gather
  in.total_bytes = 1;
  EXPECT_EQ(zc::choose_allgather_route(in).route, AgRoute::kCe);
  in.total_bytes = 0;
  EXPECT_EQ(zc::choose_allgather_route(in).route, AgRoute::kPassthrough);
}

TEST(Route, WhyIsNeverEmptyEvenWithoutAReasonForTheMissingPool) {
  // The reason is logged with %s: an empty or NULL ce_missing must not become the log line.
  for (const char* missing : {static_cast<const char*>(""), static_cast<const char*>(nullptr)}) {
    RouteInputs in;
    in.mode = AllGatherMode::kAuto;
    in.ce_ready = false;
    in.ce_missing = missing;
    in.total_bytes = 1ull << 30;
    in.min_bytes = kMin;
    const RouteDecision d = zc::choose_allgather_route(in);
    EXPECT_EQ(d.route, AgRoute::kPassthrough);
    ASSERT_NE(d.why, nullptr) << "ce_missing " << (missing ? "\"\"" : "NULL");
    EXPECT_GT(strlen(d.why), 0u) << "ce_missing \"\"";
  }
}

TEST(Route, NcclTypeSizes) {
  struct {
    int type;
    uint64_t bytes;
  } const table[] = {
      {ncclInt8, 1},    {ncclUint8, 1},    {ncclInt32, 4},      {ncclUint32, 4},
      {ncclInt64, 8},   {ncclUint64, 8},   {ncclFloat16, 2},    {ncclFloat32, 4},
      {ncclFloat64, 8}, {ncclBfloat16, 2}, {ncclFloat8e4m3, 1}, {ncclFloat8e5m2, 1},
  };
  static_assert(sizeof(table) / sizeof(table[0]) == ncclNumTypes, "one row per NCCL type");
  for (const auto& row : table) EXPECT_EQ(zc::nccl_type_size(row.type), row.bytes) << row.type;
  // Aliases are the same types.
  EXPECT_EQ(zc::nccl_type_size(ncclChar), 1u);
  EXPECT_EQ(zc::nccl_type_size(ncclInt), 4u);
  EXPECT_EQ(zc::nccl_type_size(ncclHalf), 2u);
  EXPECT_EQ(zc::nccl_type_size(ncclFloat), 4u);
  EXPECT_EQ(zc::nccl_type_size(ncclDouble), 8u);
  // Unknown types: 0, so the route passes them to NCCL to reject.
  for (int bad : {static_cast<int>(ncclNumTypes), -1, 255, 1 << 20})
    EXPECT_EQ(zc::nccl_type_size(bad), 0u) << bad;
}

}  // namespace
