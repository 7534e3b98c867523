// Runs driver programs as child processes under LD_PRELOAD of the real libzerocta.so, with
// the fake NCCL and the fake CUDA driver, and collects what they left behind: exit status,
// stdout ("key=value" lines), stderr and the fake's call log.
//
// The child's environment is built from scratch around the parent's: no ZEROCTA_*, NCCL_*,
// FAKE_*, LD_PRELOAD or LD_LIBRARY_PATH is inherited, so a developer's shell settings cannot
// change a result.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace itest {

// Paths baked in by CMake.
std::string shim_path();     // libzerocta.so
std::string fake_dir();      // fake libnccl.so.2 + libcuda.so.1 + libfake_torch_ext.so
std::string fake_old_dir();  // fake libnccl.so.2 without ncclCommShrink
std::string driver(const std::string& name);
std::string nccl_header();     // the nccl.h the shim was built against
std::string zerocta_header();  // include/zerocta.h
std::string torch_ext_path();

// A private temporary directory, removed with its contents on destruction.
class Scratch {
 public:
  Scratch();
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  const std::string& dir() const { return dir_; }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

 private:
  std::string dir_;
};

struct RunSpec {
  std::vector<std::string> argv;
  bool preload = true;                                   // LD_PRELOAD the shim
  std::string library_path;                              // default: fake_dir()
  std::vector<std::pair<std::string, std::string>> env;  // added last (ZEROCTA_*, FAKE_*, ...)
  int timeout_s = 60;
};

struct RunResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  bool timed_out = false;
  std::string out, err, log;

  std::vector<std::string> out_lines() const;
  std::vector<std::string> err_lines() const;
  std::vector<std::string> log_lines() const;
  // stdout "key=value" lines; a repeated key keeps its last value.
  std::map<std::string, std::string> kv() const;
  // Integer value of stdout key; fails the current test (and returns -999999) when missing.
  long long num(const std::string& key) const;
  std::string describe() const;  // for failure messages
};

// Runs spec in a fresh child; the fake's log is scratch.path("nccl.log") (cleared first).
RunResult run(const RunSpec& spec, const Scratch& scratch);

std::vector<std::string> split_lines(const std::string& text);
// The names in a directory (no "." or ".."), sorted; empty when it cannot be read.
std::vector<std::string> files_in(const std::string& dir);
std::string read_file(const std::string& path);
bool contains(const std::string& haystack, const std::string& needle);
// Output of a shell-free command (argv) run with the parent's environment; "" on failure.
std::string capture(const std::vector<std::string>& argv, int* exit_code = nullptr);

// "key=value" tokens of a fake log line (the first token, the function name, is "fn").
std::map<std::string, std::string> log_fields(const std::string& line);
// Lines of the log whose function name (first token) is fn.
std::vector<std::string> log_calls(const RunResult& r, const std::string& fn);

std::vector<unsigned char> unhex(const std::string& hex);

}  // namespace itest
