#include "bad_input_log.h"

#include <regex>

namespace itest {
namespace {

const char kStepMarker[] = "marker step ";

bool is_shim_query(const std::string& line) {
  for (const char* fn :
       {"ncclCommCount ", "ncclCommUserRank ", "ncclCommCuDevice ", "ncclGetVersion "}) {
    if (line.rfind(fn, 0) == 0) return true;
  }
  return false;
}

// "0x55d0c0a1b2c0" -> "0x?"; "0x0" and the fake's names ("comm#1") stay.
std::string normalize(const std::string& line) {
  static const std::regex kPointer("=0x[0-9a-f]*[1-9a-f][0-9a-f]*");
  // Fixed addresses the driver chooses (buffers at 0xd..., streams 0x57..., the arena,
  // 0xdead0000, 0x1234) are the same in every run; only heap addresses need hiding.
  std::string out;
  std::sregex_iterator it(line.begin(), line.end(), kPointer), end;
  size_t pos = 0;
  for (; it != end; ++it) {
    const std::string value = it->str().substr(1);
    const unsigned long long v = std::stoull(value.substr(2), nullptr, 16);
    const bool heap = v >= 0x500000000000ull;  // glibc heap and mmap on x86-64
    out += line.substr(pos, static_cast<size_t>(it->position()) - pos);
    out += heap ? "=0x?" : it->str();
    pos = static_cast<size_t>(it->position() + it->length());
  }
  return out + line.substr(pos);
}

}  // namespace

std::map<std::string, std::vector<std::string>> step_segments(const RunResult& r) {
  std::map<std::string, std::vector<std::string>> out;
  std::vector<std::string>* current = nullptr;
  for (const std::string& line : r.log_lines()) {
    if (line.rfind(kStepMarker, 0) == 0) {
      current = &out[line.substr(sizeof(kStepMarker) - 1)];
      continue;
    }
    if (line.rfind("marker ", 0) == 0) {
      current = nullptr;
      continue;
    }
    if (current == nullptr || line.rfind("cuda ", 0) == 0) continue;
    current->push_back(normalize(line));
  }
  return out;
}

std::string segment_difference(const std::vector<std::string>& want,
                               const std::vector<std::string>& got) {
  std::vector<std::string> kept;
  for (const std::string& line : got) {
    const bool expected_next = kept.size() < want.size() && want[kept.size()] == line;
    if (!expected_next && is_shim_query(line)) continue;
    kept.push_back(line);
  }
  for (size_t i = 0; i < want.size() || i < kept.size(); ++i) {
    const std::string a = i < want.size() ? want[i] : "<nothing>";
    const std::string b = i < kept.size() ? kept[i] : "<nothing>";
    if (a != b) return "NCCL received\n  without shim: " + a + "\n  with shim:    " + b;
  }
  return "";
}

std::string bad_input_driver() { return BAD_INPUT_DRIVER; }

RunResult run_bad_input(const std::vector<std::string>& steps, bool preload,
                        const std::vector<std::pair<std::string, std::string>>& env,
                        const Scratch& scratch) {
  RunSpec spec;
  spec.argv = {bad_input_driver()};
  spec.argv.insert(spec.argv.end(), steps.begin(), steps.end());
  spec.preload = preload;
  spec.env = {{"FAKE_NCCL_CHECK_ARGS", "1"}};
  spec.env.insert(spec.env.end(), env.begin(), env.end());
  return run(spec, scratch);
}

}  // namespace itest
