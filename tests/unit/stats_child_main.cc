// The child the StatsExitReport tests (stats_test.cc) run with ZEROCTA_STATS set: a program of
// its own rather than a test of the unit binary, so that ctest never lists it.
//   ZCTEST_STATS_TEST_WRITE_NOW=<file>  checks stats_write_now() on that file (exit codes 10-18)
//   otherwise                           counts, then makes two grandchildren that exit normally:
//                                       one by fork(), one by a raw clone (exit codes 20-23)
// Exit status 0: every check passed; the parent reads the files and the stderr it left.
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "stats.h"
#include "zerocta.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool exited_cleanly(pid_t pid) {
  int status = 0;
  return waitpid(pid, &status, 0) == pid && WIFEXITED(status);
}

int exit_report() {
  zc::stats_install_reporter();
  zerocta_reset_stats();
  for (int i = 0; i < 3; ++i) zc::stats_count(zerocta_op_allgather, zerocta_route_ce, 1000);
  zc::stats_count(zerocta_op_send, zerocta_route_passthrough, 7);
  zc::stats_comm_created(true);
  const pid_t pid = fork();
  if (pid < 0) return 20;
  if (pid == 0) exit(0);  // runs the atexit reporter, as the grandchild's own
  if (!exited_cleanly(pid)) return 21;
  // A child made without fork()'s atfork handlers (a raw clone, as some spawners do) inherits
  // the counters and the exit handler but is not their owner: it must report nothing.
  const long raw = syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
  if (raw < 0) return 22;
  if (raw == 0) exit(0);
  if (!exited_cleanly(static_cast<pid_t>(raw))) return 23;
  return 0;  // through exit(): the reporter writes this process's file
}

// ZEROCTA_STATS names `file`; stats_write_now() must write it without any exit handler (this
// part leaves by _exit).
[[noreturn]] void write_now(const std::string& file) {
  if (getenv("ZCTEST_STATS_TEST_UNWRITABLE") != nullptr) {
    // Every write fails: one WARN for the process, however many teardowns and the exit.
    zc::stats_install_reporter();
    for (int i = 0; i < 3; ++i) {
      zc::stats_count(zerocta_op_allgather, zerocta_route_ce, 1);
      zc::stats_write_now();
    }
    zc::stats_count(zerocta_op_allgather, zerocta_route_ce, 1);
    exit(0);  // and the exit report tries once more
  }
  zc::stats_write_now();  // before stats_install_reporter(): does nothing
  if (access(file.c_str(), F_OK) == 0) _exit(10);
  zc::stats_install_reporter();
  zerocta_reset_stats();
  zc::stats_count(zerocta_op_allgather, zerocta_route_ce, 1000);
  zc::stats_write_now();
  if (read_file(file).find("\"allgather\":{\"ce\":{\"calls\":1,") == std::string::npos) _exit(11);
  // Unchanged counters: not written again (the file removed stays removed) ...
  if (unlink(file.c_str()) != 0) _exit(12);
  zc::stats_write_now();
  if (access(file.c_str(), F_OK) == 0) _exit(13);
  // ... changed ones are.
  zc::stats_count(zerocta_op_allgather, zerocta_route_ce, 1000);
  zc::stats_write_now();
  if (read_file(file).find("\"allgather\":{\"ce\":{\"calls\":2,") == std::string::npos) _exit(14);
  // A forked child writes its own file (here the same %r/%p-less name) with its own counters.
  const pid_t pid = fork();
  if (pid < 0) _exit(15);
  if (pid == 0) {
    zc::stats_count(zerocta_op_send, zerocta_route_passthrough, 1);
    zc::stats_write_now();
    _exit(0);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) _exit(16);
  if (read_file(file).find("\"send\":{\"passthrough\"") == std::string::npos) _exit(17);
  if (read_file(file).find("\"allgather\"") != std::string::npos) _exit(18);
  _exit(0);  // no atexit report: what is on disk is what stats_write_now() wrote
}

}  // namespace

int main() {
  if (const char* file = getenv("ZCTEST_STATS_TEST_WRITE_NOW")) write_now(file);
  return exit_report();
}
