#include "gpu_telemetry.h"

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace zcb {

const char* const kTelemetryQuery =
    "--query-gpu=index,clocks.sm,clocks.mem,power.draw,temperature.gpu "
    "--format=csv,noheader,nounits";

namespace {

// One CSV field: a number, or NaN for nvidia-smi's "[N/A]" / "N/A"; false for anything else.
bool field(const std::string& text, double* out) {
  std::string t;
  for (char c : text)
    if (c != ' ' && c != '\t' && c != '\r') t += c;
  if (t == "[N/A]" || t == "N/A" || t == "[NotSupported]") {
    *out = NAN;
    return true;
  }
  if (t.empty()) return false;
  char* end = nullptr;
  *out = strtod(t.c_str(), &end);
  return *end == '\0';
}

std::string number(double v, const char* fmt) {
  if (!std::isfinite(v)) return "?";
  char buf[32];
  snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string reading(const GpuReading& g) {
  return number(g.sm_mhz, "%.0f") + "/" + number(g.mem_mhz, "%.0f") + " MHz " +
         number(g.power_w, "%.0f") + " W " + number(g.temp_c, "%.0f") + " C";
}

}  // namespace

GpuTelemetry parse_gpu_telemetry(const std::string& csv) {
  GpuTelemetry t;
  std::istringstream in(csv);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::vector<double> v;
    std::istringstream cells(line);
    std::string cell;
    while (std::getline(cells, cell, ',')) {
      double x;
      if (!field(cell, &x)) return GpuTelemetry();
      v.push_back(x);
    }
    if (v.size() != 5 || !std::isfinite(v[0])) return GpuTelemetry();
    GpuReading g;
    g.index = static_cast<int>(v[0]);
    g.sm_mhz = v[1];
    g.mem_mhz = v[2];
    g.power_w = v[3];
    g.temp_c = v[4];
    t.gpus.push_back(g);
  }
  t.available = !t.gpus.empty();
  return t;
}

GpuTelemetry read_gpu_telemetry() {
  const std::string cmd = std::string("nvidia-smi ") + kTelemetryQuery + " 2>/dev/null";
  fflush(stdout);  // popen forks: nothing buffered may be written twice
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return GpuTelemetry();
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return GpuTelemetry();
  return parse_gpu_telemetry(out);
}

std::string format_telemetry(const GpuTelemetry& before, const GpuTelemetry& after) {
  if (!before.available && !after.available) return "unavailable";
  std::string s;
  const size_t n = std::max(before.gpus.size(), after.gpus.size());
  for (size_t i = 0; i < n; ++i) {
    const GpuReading* b = i < before.gpus.size() ? &before.gpus[i] : nullptr;
    const GpuReading* a = i < after.gpus.size() ? &after.gpus[i] : nullptr;
    if (!s.empty()) s += "; ";
    s += "GPU" + std::to_string((b ? b : a)->index) + " ";
    s += (b ? reading(*b) : "unavailable") + " -> " + (a ? reading(*a) : "unavailable");
  }
  return s;
}

}  // namespace zcb
