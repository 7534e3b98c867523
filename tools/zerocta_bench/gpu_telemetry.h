// GPU clocks, power and temperature around each contention run, from nvidia-smi in the parent
// (which must never initialise CUDA itself): a run whose GPUs throttled, or started hot, shows
// it next to its numbers.
#pragma once

#include <string>
#include <vector>

namespace zcb {

struct GpuReading {
  int index = -1;
  double sm_mhz = 0, mem_mhz = 0, power_w = 0, temp_c = 0;  // NaN where nvidia-smi said N/A
};

struct GpuTelemetry {
  bool available = false;  // false: nvidia-smi missing, failed or printed nothing usable
  std::vector<GpuReading> gpus;
};

// The query nvidia-smi runs (CSV, no header, no units).
extern const char* const kTelemetryQuery;

// Runs `nvidia-smi <kTelemetryQuery>` (found on PATH) and parses its output.
GpuTelemetry read_gpu_telemetry();

// Parses nvidia-smi's "index, sm, mem, power, temp" lines; a line that does not parse makes
// the whole reading unavailable. Pure, for the self-test.
GpuTelemetry parse_gpu_telemetry(const std::string& csv);

// "GPU0 1980/2619 MHz 412 W 51 C -> 1755/2619 MHz 690 W 58 C; GPU1 ..." or "unavailable".
std::string format_telemetry(const GpuTelemetry& before, const GpuTelemetry& after);

}  // namespace zcb
