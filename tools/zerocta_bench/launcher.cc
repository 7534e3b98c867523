#include "launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "protocol.h"

extern char** environ;

namespace zcb {

namespace {

volatile sig_atomic_t g_interrupted = 0;

void on_signal(int) { g_interrupted = 1; }

using Clock = std::chrono::steady_clock;

// How long processes that reported Done may take to exit before they are killed: 30 s, or a
// third of a shorter path limit.
int exit_grace_s(int timeout_s) { return std::max(1, std::min(30, timeout_s / 3)); }

struct Proc {
  pid_t pid = -1;
  int to_child = -1;    // parent writes (unique id, barrier answers)
  int from_child = -1;  // parent reads
  std::string buf;
  bool eof = false;
  bool done = false;
  bool waited = false;
  int status = 0;
  bool agree_pending = false;
  uint64_t agree_value = 0;
};

bool is_zerocta_entry(const std::string& e) {
  size_t slash = e.rfind('/');
  std::string base = slash == std::string::npos ? e : e.substr(slash + 1);
  return base.rfind("libzerocta", 0) == 0;
}

// LD_PRELOAD without any libzerocta entry (entries are separated by ':' or spaces).
std::string strip_zerocta(const std::string& preload) {
  std::string out, cur;
  auto flush = [&] {
    if (!cur.empty() && !is_zerocta_entry(cur)) out += (out.empty() ? "" : ":") + cur;
    cur.clear();
  };
  for (char c : preload) {
    if (c == ':' || c == ' ')
      flush();
    else
      cur += c;
  }
  flush();
  return out;
}

void set_var(std::vector<std::string>* env, const std::string& name, const std::string& value) {
  const std::string prefix = name + "=";
  env->erase(std::remove_if(env->begin(), env->end(),
                            [&](const std::string& e) { return e.rfind(prefix, 0) == 0; }),
             env->end());
  env->push_back(prefix + value);
}

std::string get_var(const std::vector<std::string>& env, const std::string& name) {
  const std::string prefix = name + "=";
  for (const std::string& e : env)
    if (e.rfind(prefix, 0) == 0) return e.substr(prefix.size());
  return "";
}

bool write_msg(int fd, MsgType type, const void* payload, size_t len) {
  std::string buf(sizeof(MsgHeader) + len, '\0');
  MsgHeader h{type, static_cast<uint32_t>(len)};
  memcpy(&buf[0], &h, sizeof(h));
  memcpy(&buf[sizeof(h)], payload, len);
  size_t off = 0;
  while (off < buf.size()) {
    ssize_t n = write(fd, buf.data() + off, buf.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return std::string("killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  return "ended abnormally";
}

}  // namespace

std::vector<std::string> worker_environment(const std::vector<std::string>& base, PathId path,
                                            const std::string& shim_lib, bool multicast_off,
                                            CollOp op) {
  std::vector<std::string> env = base;
  // --multicast-off: multicast stays off on machines that must not use it, whatever the
  // caller's environment says. Never done otherwise: on the user's cluster NVLS may be what
  // they run.
  if (multicast_off) {
    for (const char* kv : kMulticastOffEnv) {
      const std::string s = kv;
      set_var(&env, s.substr(0, s.find('=')), s.substr(s.find('=') + 1));
    }
  }
  const std::string rest = strip_zerocta(get_var(env, "LD_PRELOAD"));
  if (path_uses_shim(path)) {
    set_var(&env, "LD_PRELOAD", rest.empty() ? shim_lib : shim_lib + ":" + rest);
    set_var(&env, "ZEROCTA_ALLGATHER", path_allgather_mode(path));
    if (op == CollOp::kReduceScatter)
      set_var(&env, "ZEROCTA_REDUCESCATTER", path_reducescatter_mode(path));
  } else if (rest.empty()) {
    env.erase(std::remove_if(env.begin(), env.end(),
                             [](const std::string& e) { return e.rfind("LD_PRELOAD=", 0) == 0; }),
              env.end());
  } else {
    set_var(&env, "LD_PRELOAD", rest);
  }
  return env;
}

void install_parent_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: poll() returns EINTR and the loop notices at once
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

bool parent_interrupted() { return g_interrupted != 0; }

LaunchOutcome run_path(const LaunchSpec& spec, const MessageHandler& handler) {
  LaunchOutcome out;
  const auto start = Clock::now();
  const int nprocs = path_process_count(spec.path, spec.one_process, spec.nranks);

  std::vector<std::string> base;
  for (char** e = environ; *e; ++e) base.emplace_back(*e);
  const std::vector<std::string> env =
      worker_environment(base, spec.path, spec.shim_lib, spec.multicast_off, spec.op);

  std::vector<Proc> procs(static_cast<size_t>(nprocs));
  pid_t pgid = 0;
  const pid_t parent = getpid();
  std::string spawn_error;
  for (int p = 0; p < nprocs; ++p) {
    int down[2], up[2];
    if (pipe2(down, O_CLOEXEC) != 0 || pipe2(up, O_CLOEXEC) != 0) {
      spawn_error = std::string("pipe2: ") + strerror(errno);
      break;
    }
    const int rank = nprocs == 1 ? -1 : p;  // -1: the process drives every GPU
    // Everything the child needs is built before fork().
    std::vector<std::string> args = {"zerocta-bench"};
    args.insert(args.end(), spec.args.begin(), spec.args.end());
    const std::string fds = std::to_string(down[0]) + "," + std::to_string(up[1]);
    for (const std::string& a :
         {std::string("--worker-path"), std::string(path_name(spec.path)),
          std::string("--worker-mode"), spec.mode, std::string("--worker-rank"),
          std::to_string(rank), std::string("--worker-nranks"), std::to_string(spec.nranks),
          std::string("--worker-fds"), fds})
      args.push_back(a);
    if (spec.repeat >= 0) {
      args.push_back("--worker-repeat");
      args.push_back(std::to_string(spec.repeat));
    }
    std::vector<char*> argv, envp;
    for (std::string& a : args) argv.push_back(&a[0]);
    argv.push_back(nullptr);
    std::vector<std::string> env_copy = env;
    for (std::string& e : env_copy) envp.push_back(&e[0]);
    envp.push_back(nullptr);

    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, pgid);  // pgid 0: the first worker leads a new group
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      fcntl(down[0], F_SETFD, 0);  // these two survive exec, every other pipe end closes
      fcntl(up[1], F_SETFD, 0);
      signal(SIGPIPE, SIG_DFL);
      execve("/proc/self/exe", argv.data(), envp.data());
      _exit(127);
    }
    close(down[0]);
    close(up[1]);
    if (pid < 0) {
      close(down[1]);
      close(up[0]);
      spawn_error = std::string("fork: ") + strerror(errno);
      break;
    }
    if (pgid == 0) pgid = pid;
    setpgid(pid, pgid);  // also here, so a kill right after fork already reaches it
    procs[p].pid = pid;
    procs[p].to_child = down[1];
    procs[p].from_child = up[0];
  }

  const auto deadline = start + std::chrono::seconds(spec.timeout_s);
  std::string error = spawn_error;
  bool failed = !spawn_error.empty();
  auto fail = [&](const std::string& why) {
    if (!failed) error = why;
    failed = true;
  };

  // Dispatches one complete frame from process p.
  auto dispatch = [&](int p, uint32_t type, const std::vector<char>& payload) {
    switch (type) {
      case kMsgUniqueId:
        if (p == 0)
          for (int q = 1; q < nprocs; ++q)
            write_msg(procs[q].to_child, kMsgUniqueIdFwd, payload.data(), payload.size());
        break;
      case kMsgAgree: {
        AgreeMsg m{};
        memcpy(&m, payload.data(), std::min(payload.size(), sizeof(m)));
        procs[p].agree_pending = true;
        procs[p].agree_value = m.value;
        bool all =
            std::all_of(procs.begin(), procs.end(), [](const Proc& x) { return x.agree_pending; });
        if (all) {
          AgreeMsg r{0};
          for (Proc& x : procs) r.value = std::max(r.value, x.agree_value);
          for (Proc& x : procs) {
            x.agree_pending = false;
            write_msg(x.to_child, kMsgAgreed, &r, sizeof(r));
          }
        }
        break;
      }
      case kMsgError: {
        ErrorMsg m{};
        memcpy(&m, payload.data(), std::min(payload.size(), sizeof(m)));
        m.text[sizeof(m.text) - 1] = '\0';
        fail(m.rank >= 0 ? "rank " + std::to_string(m.rank) + ": " + m.text : std::string(m.text));
        break;
      }
      case kMsgDone:
        procs[p].done = true;
        break;
      default:
        handler(type, payload);
    }
  };

  Clock::time_point all_done_at{};
  bool exit_hang = false;
  while (!failed) {
    std::vector<pollfd> pfds;
    std::vector<int> which;
    for (int p = 0; p < nprocs; ++p)
      if (!procs[p].eof) {
        pfds.push_back({procs[p].from_child, POLLIN, 0});
        which.push_back(p);
      }
    if (pfds.empty()) break;
    // Every process reported Done but one has not exited (a teardown that hangs): its results
    // are complete, so kill it after a grace period and say so, without failing the path.
    const bool all_done =
        std::all_of(procs.begin(), procs.end(), [](const Proc& x) { return x.done; });
    if (all_done && all_done_at == Clock::time_point()) all_done_at = Clock::now();
    if (all_done &&
        Clock::now() - all_done_at > std::chrono::seconds(exit_grace_s(spec.timeout_s))) {
      exit_hang = true;
      break;
    }
    if (g_interrupted) {
      out.interrupted = true;
      fail("interrupted");
      break;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      out.timed_out = true;
      std::string pending;
      for (int p = 0; p < nprocs; ++p)
        if (!procs[p].done) pending += (pending.empty() ? "" : ",") + std::to_string(p);
      fail("timed out after " + std::to_string(spec.timeout_s) +
           " s (processes not finished: " + pending + "); the path's processes were killed");
      break;
    }
    int r = poll(pfds.data(), pfds.size(), static_cast<int>(std::min<long long>(left, 500)));
    if (r < 0 && errno == EINTR) continue;
    for (size_t i = 0; i < pfds.size() && !failed; ++i) {
      if (!(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Proc& pr = procs[which[i]];
      char buf[65536];
      ssize_t n = read(pr.from_child, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        pr.eof = true;
        if (!pr.done) {
          int status = 0;
          // Give the dead process a moment to be reapable, for a precise message.
          for (int k = 0; k < 20 && waitpid(pr.pid, &status, WNOHANG) == 0; ++k) usleep(10000);
          pr.waited = true;
          pr.status = status;
          fail("process " + std::to_string(which[i]) + " (pid " + std::to_string(pr.pid) + ") " +
               describe_status(status) + " before finishing");
        }
        continue;
      }
      pr.buf.append(buf, static_cast<size_t>(n));
      while (pr.buf.size() >= sizeof(MsgHeader) && !failed) {
        MsgHeader h;
        memcpy(&h, pr.buf.data(), sizeof(h));
        if (pr.buf.size() < sizeof(h) + h.len) break;
        std::vector<char> payload(pr.buf.begin() + sizeof(h), pr.buf.begin() + sizeof(h) + h.len);
        pr.buf.erase(0, sizeof(h) + h.len);
        dispatch(which[i], h.type, payload);
      }
    }
  }

  if (failed || exit_hang) {
    if (pgid > 0) kill(-pgid, SIGKILL);
    // Also one by one: a worker whose setpgid raced with the group leader's exit is not in it.
    for (Proc& pr : procs)
      if (pr.pid > 0 && !pr.waited) kill(pr.pid, SIGKILL);
  }
  for (Proc& pr : procs) {
    if (pr.to_child >= 0) close(pr.to_child);
    if (pr.from_child >= 0) close(pr.from_child);
  }
  // Reap everyone. After SIGKILL this is quick; a clean run has exited already.
  const auto reap_deadline = Clock::now() + std::chrono::seconds(30);
  for (Proc& pr : procs) {
    if (pr.pid <= 0 || pr.waited) continue;
    while (true) {
      pid_t w = waitpid(pr.pid, &pr.status, WNOHANG);
      if (w == pr.pid || w < 0) break;
      if (Clock::now() > reap_deadline) {
        kill(pr.pid, SIGKILL);
        waitpid(pr.pid, &pr.status, 0);
        break;
      }
      usleep(20000);
    }
    pr.waited = true;
    if (!failed && !exit_hang && !(WIFEXITED(pr.status) && WEXITSTATUS(pr.status) == 0))
      fail("process pid " + std::to_string(pr.pid) + " " + describe_status(pr.status));
  }
  out.ok = !failed;
  out.error = error;
  if (exit_hang)
    out.error = "WARNING: a process did not exit within " +
                std::to_string(exit_grace_s(spec.timeout_s)) +
                " s of reporting all its results (teardown hang?); it was killed";
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

}  // namespace zcb
