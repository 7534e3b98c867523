#include "harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace itest {

std::string shim_path() { return ZEROCTA_SHIM_PATH; }
std::string fake_dir() { return FAKE_NCCL_DIR; }
std::string fake_old_dir() { return FAKE_NCCL_OLD_DIR; }
std::string driver(const std::string& name) { return std::string(DRIVER_DIR) + "/" + name; }
std::string nccl_header() { return std::string(ZEROCTA_NCCL_INCLUDE_DIR) + "/nccl.h"; }
std::string zerocta_header() { return ZEROCTA_PUBLIC_HEADER; }
std::string torch_ext_path() { return FAKE_TORCH_EXT_PATH; }

Scratch::Scratch() {
  const char* tmp = getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/zerocta-interpose-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp: " << strerror(errno);
    return;
  }
  dir_ = buf.data();
}

Scratch::~Scratch() {
  if (dir_.empty()) return;
  // Flat directory: the tests only create plain files in it.
  if (DIR* d = opendir(dir_.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") unlink((dir_ + "/" + name).c_str());
    }
    closedir(d);
  }
  rmdir(dir_.c_str());
}

namespace {

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// The parent's environment minus everything that could steer the shim or the fakes.
std::vector<std::string> child_environment(const RunSpec& spec, const Scratch& scratch) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    if (starts_with(kv, "ZEROCTA_") || starts_with(kv, "NCCL_") || starts_with(kv, "FAKE_") ||
        starts_with(kv, "CUDA_") || starts_with(kv, "LD_PRELOAD=") ||
        starts_with(kv, "LD_LIBRARY_PATH=") || starts_with(kv, "LD_BIND_NOW="))
      continue;
    env.push_back(kv);
  }
  if (spec.preload) env.push_back("LD_PRELOAD=" + shim_path());
  env.push_back("LD_LIBRARY_PATH=" + (spec.library_path.empty() ? fake_dir() : spec.library_path));
  env.push_back("FAKE_NCCL_LOG=" + scratch.path("nccl.log"));
  for (const auto& kv : spec.env) env.push_back(kv.first + "=" + kv.second);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (std::string& s : v) out.push_back(&s[0]);
  out.push_back(nullptr);
  return out;
}

}  // namespace

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

RunResult run(const RunSpec& spec, const Scratch& scratch) {
  RunResult r;
  const std::string out_path = scratch.path("stdout"), err_path = scratch.path("stderr"),
                    log_path = scratch.path("nccl.log");
  unlink(log_path.c_str());
  std::vector<std::string> argv = spec.argv, env = child_environment(spec, scratch);
  std::vector<char*> argv_c = c_strings(argv), env_c = c_strings(env);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv_c[0], &fa, nullptr, argv_c.data(), env_c.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    ADD_FAILURE() << "posix_spawn " << argv[0] << ": " << strerror(rc);
    return r;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(spec.timeout_s);
  int status = 0;
  for (;;) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) {
      ADD_FAILURE() << "waitpid: " << strerror(errno);
      return r;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      r.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  r.log = read_file(log_path);
  return r;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

std::vector<std::string> RunResult::out_lines() const { return split_lines(out); }
std::vector<std::string> RunResult::err_lines() const { return split_lines(err); }
std::vector<std::string> RunResult::log_lines() const { return split_lines(log); }

std::map<std::string, std::string> RunResult::kv() const {
  std::map<std::string, std::string> m;
  for (const std::string& line : out_lines()) {
    size_t eq = line.find('=');
    if (eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return m;
}

long long RunResult::num(const std::string& key) const {
  auto m = kv();
  auto it = m.find(key);
  if (it == m.end()) {
    ADD_FAILURE() << "driver printed no " << key << "\n" << describe();
    return -999999;
  }
  return strtoll(it->second.c_str(), nullptr, 0);
}

std::string RunResult::describe() const {
  std::ostringstream s;
  s << "exit=" << exit_code << " signal=" << signal << (timed_out ? " TIMED OUT" : "")
    << "\n--- stdout ---\n"
    << out << "--- stderr ---\n"
    << err << "--- fake log ---\n"
    << log << "---";
  return s.str();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string capture(const std::vector<std::string>& argv, int* exit_code) {
  int fds[2];
  if (pipe(fds) != 0) return "";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addclose(&fa, fds[1]);
  std::vector<std::string> args = argv;
  std::vector<char*> argv_c = c_strings(args);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, argv_c[0], &fa, nullptr, argv_c.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  std::string out;
  if (rc == 0) {
    char buf[4096];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  if (rc == 0) waitpid(pid, &status, 0);
  if (exit_code) *exit_code = rc == 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

std::map<std::string, std::string> log_fields(const std::string& line) {
  std::map<std::string, std::string> m;
  std::istringstream in(line);
  std::string tok;
  bool first = true, after_arrow = false;
  while (in >> tok) {
    if (first) {
      m["fn"] = tok;
      first = false;
    } else if (tok == "->") {
      after_arrow = true;
    } else if (after_arrow && m.count("result") == 0) {
      m["result"] = tok;
    } else {
      size_t eq = tok.find('=');
      if (eq != std::string::npos) m[tok.substr(0, eq)] = tok.substr(eq + 1);
    }
  }
  return m;
}

std::vector<std::string> log_calls(const RunResult& r, const std::string& fn) {
  std::vector<std::string> out;
  for (const std::string& line : r.log_lines())
    if (line == fn || line.compare(0, fn.size() + 1, fn + " ") == 0) out.push_back(line);
  return out;
}

std::vector<unsigned char> unhex(const std::string& hex) {
  std::vector<unsigned char> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<unsigned char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

}  // namespace itest
