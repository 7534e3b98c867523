#include "mp_harness.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>

namespace zgpu {
namespace {

using Clock = std::chrono::steady_clock;

// Lives in an anonymous shared mapping made before the first fork, so the parent sees the
// heartbeats and result blocks the ranks write.
struct SharedState {
  std::atomic<uint64_t> beats[kMaxRanks];
  std::atomic<uint32_t> barrier_arrived;
  std::atomic<uint32_t> barrier_generation;
  alignas(64) char blocks[kMaxRanks][kRankSharedBlockBytes];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "heartbeats must be lock-free");

SharedState* shared_state() {
  static SharedState* state = [] {
    void* p = mmap(nullptr, sizeof(SharedState), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
    if (p == MAP_FAILED) {
      perror("zgpu: mmap of the shared state");
      abort();
    }
    return static_cast<SharedState*>(p);
  }();
  return state;
}

// Set in a rank process only.
int g_rank = -1;
int g_nranks = 0;
int g_msg_fd = -1;

bool write_full(int fd, const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool read_full(int fd, void* data, size_t len) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    ssize_t n = read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

struct Pipe {
  int rd = -1;
  int wr = -1;
};

Pipe make_pipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    perror("zgpu: pipe2");
    abort();
  }
  return Pipe{fds[0], fds[1]};
}

void close_fd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// Body of rank `rank` after fork: device, ids, then the test's function.
int rank_main(int rank, int nranks, int ngpus, const RankFn& fn, const RunOptions& options,
              std::vector<Pipe>& id_pipes) {
  try {
    if (options.before_cuda) options.before_cuda(rank);
    RankContext ctx;
    ctx.rank = rank;
    ctx.nranks = nranks;
    ctx.device = options.use_cuda ? rank % ngpus : -1;
    if (options.use_cuda) {
      cudaError_t err = cudaSetDevice(ctx.device);
      if (err != cudaSuccess) {
        report("cudaSetDevice(" + std::to_string(ctx.device) +
               ") failed: " + cudaGetErrorString(err));
        return 2;
      }
    }
    ctx.ids.resize(static_cast<size_t>(options.num_ids));
    const size_t id_bytes = ctx.ids.size() * sizeof(ncclUniqueId);
    if (rank == 0) {
      for (size_t k = 0; k < ctx.ids.size(); ++k) {
        ncclUniqueId& id = ctx.ids[k];
        if (!options.use_cuda) {
          for (size_t i = 0; i < sizeof(id.internal); ++i) {
            id.internal[i] = static_cast<char>((getpid() + 7 * k + 13 * i) & 0x7f);
          }
          continue;
        }
        ncclResult_t res = ncclGetUniqueId(&id);
        if (res != ncclSuccess) {
          report(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(res));
          return 2;
        }
      }
      for (int r = 1; r < nranks; ++r) {
        if (!write_full(id_pipes[r].wr, ctx.ids.data(), id_bytes)) {
          report("could not send the unique ids to rank " + std::to_string(r));
          return 2;
        }
        close_fd(id_pipes[r].wr);
      }
    } else if (!read_full(id_pipes[rank].rd, ctx.ids.data(), id_bytes)) {
      report("rank 0 did not send the unique ids (it probably failed first)");
      return 2;
    }
    heartbeat();
    return fn(ctx);
  } catch (const std::exception& e) {
    report(std::string("exception: ") + e.what());
  } catch (...) {
    report("unknown exception");
  }
  return kRankExceptionExit;
}

std::string describe(const RankOutcome& o) {
  std::ostringstream s;
  s << "rank " << o.rank << ": ";
  if (!o.killed_because.empty()) {
    s << "KILLED (" << o.killed_because << ")";
  } else if (o.exited) {
    s << "exit code " << o.exit_code;
  } else {
    s << "died by signal " << o.signal << " (" << strsignal(o.signal) << ")";
  }
  return s.str();
}

}  // namespace

long env_long(const char* name, long fallback) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  long value = strtol(v, &end, 0);
  if (end == v) return fallback;
  return value;
}

void* rank_shared_block(int rank) {
  if (rank < 0 || rank >= kMaxRanks) return nullptr;
  return shared_state()->blocks[rank];
}

void report(const std::string& message) {
  std::string line =
      (g_rank >= 0 ? "[rank " + std::to_string(g_rank) + "] " : std::string()) + message;
  if (line.size() > 4000) line.resize(4000);
  line += '\n';
  fputs(line.c_str(), stderr);
  fflush(stderr);
  if (g_msg_fd >= 0) write_full(g_msg_fd, line.data(), line.size());
}

void heartbeat() {
  if (g_rank >= 0) shared_state()->beats[g_rank].fetch_add(1, std::memory_order_relaxed);
}

void barrier() {
  if (g_rank < 0) return;
  SharedState* state = shared_state();
  const uint32_t generation = state->barrier_generation.load();
  if (state->barrier_arrived.fetch_add(1) + 1 == static_cast<uint32_t>(g_nranks)) {
    state->barrier_arrived.store(0);
    state->barrier_generation.fetch_add(1);
    return;
  }
  while (state->barrier_generation.load() == generation) {
    heartbeat();
    usleep(1000);
  }
}

int visible_gpu_count() {
  static int cached = -1;
  if (cached >= 0) return cached;
  fflush(stdout);
  fflush(stderr);
  Pipe p = make_pipe();
  pid_t pid = fork();
  if (pid < 0) {
    perror("zgpu: fork");
    abort();
  }
  if (pid == 0) {
    close_fd(p.rd);
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    write_full(p.wr, &count, sizeof(count));
    _exit(0);  // no atexit handlers: this child exists only to ask the driver
  }
  close_fd(p.wr);
  int count = 0;
  pollfd pfd{p.rd, POLLIN, 0};
  // A driver that does not answer in a minute is as good as no GPU for a test.
  if (poll(&pfd, 1, 60000) <= 0 || !read_full(p.rd, &count, sizeof(count))) {
    kill(pid, SIGKILL);
    count = 0;
  }
  close_fd(p.rd);
  waitpid(pid, nullptr, 0);
  cached = count;
  return cached;
}

bool RunResult::ok() const {
  if (ranks.empty()) return false;
  for (const auto& r : ranks) {
    if (!r.ok()) return false;
  }
  return true;
}

std::string RunResult::summary() const {
  std::ostringstream s;
  for (const auto& r : ranks) {
    if (r.ok()) continue;
    s << describe(r) << "\n";
    if (!r.messages.empty()) s << r.messages;
  }
  return s.str();
}

RunResult run_ranks(int nranks, const RankFn& fn, const RunOptions& options) {
  RunResult result;
  const int ngpus = options.use_cuda ? visible_gpu_count() : 0;
  if (nranks < 1 || nranks > kMaxRanks || (options.use_cuda && ngpus < 1)) {
    RankOutcome o;
    o.killed_because =
        "cannot run " + std::to_string(nranks) + " ranks on " + std::to_string(ngpus) + " GPUs";
    result.ranks.push_back(o);
    return result;
  }
  SharedState* state = shared_state();
  memset(static_cast<void*>(state), 0, sizeof(SharedState));

  std::vector<Pipe> id_pipes(static_cast<size_t>(nranks));
  std::vector<Pipe> msg_pipes(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    if (r > 0) id_pipes[r] = make_pipe();
    msg_pipes[r] = make_pipe();
  }
  fflush(stdout);
  fflush(stderr);
  const pid_t parent = getpid();
  std::vector<pid_t> pids(static_cast<size_t>(nranks), -1);
  for (int r = 0; r < nranks; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("zgpu: fork");
      abort();
    }
    if (pid == 0) {
      // Die with the parent: an orphaned rank would otherwise hold a GPU forever.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(9);
      for (int q = 0; q < nranks; ++q) {
        close_fd(msg_pipes[q].rd);
        if (q != r) close_fd(msg_pipes[q].wr);
        if (q != r) close_fd(id_pipes[q].rd);
        if (r != 0) close_fd(id_pipes[q].wr);
      }
      g_rank = r;
      g_nranks = nranks;
      g_msg_fd = msg_pipes[r].wr;
      int code = rank_main(r, nranks, ngpus, fn, options, id_pipes);
      fflush(stdout);
      fflush(stderr);
      // A rank that threw may have left work hung on the GPU; at-exit teardown (CUDA, NCCL)
      // could block on it, so leave at once. Otherwise a normal exit, so that at-exit
      // reporters (the shim's ZEROCTA_STATS) run.
      if (code == kRankExceptionExit) _exit(code);
      exit(code);
    }
    pids[r] = pid;
  }
  for (int r = 0; r < nranks; ++r) {
    close_fd(id_pipes[r].rd);
    close_fd(id_pipes[r].wr);
    close_fd(msg_pipes[r].wr);
  }

  result.ranks.resize(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) result.ranks[r].rank = r;
  std::vector<bool> alive(static_cast<size_t>(nranks), true);
  std::vector<uint64_t> last_beat(static_cast<size_t>(nranks), 0);
  std::vector<Clock::time_point> last_progress(static_cast<size_t>(nranks), Clock::now());
  const auto start = Clock::now();
  const auto total_deadline = start + std::chrono::seconds(options.total_timeout_s);
  bool have_grace_deadline = false;
  Clock::time_point grace_deadline;
  int first_failed = -1;

  auto drain = [&](int r, bool until_eof) {
    char buf[4096];
    for (;;) {
      if (msg_pipes[r].rd < 0) return;
      if (!until_eof) {
        pollfd pfd{msg_pipes[r].rd, POLLIN, 0};
        if (poll(&pfd, 1, 0) <= 0) return;
      }
      ssize_t n = read(msg_pipes[r].rd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        close_fd(msg_pipes[r].rd);
        return;
      }
      if (result.ranks[r].messages.size() < (1u << 20)) {
        result.ranks[r].messages.append(buf, static_cast<size_t>(n));
      }
    }
  };
  auto kill_alive = [&](const std::string& why) {
    for (int r = 0; r < nranks; ++r) {
      if (!alive[r]) continue;
      kill(pids[r], SIGKILL);
      result.ranks[r].killed_because = why;
    }
  };

  int live = nranks;
  while (live > 0) {
    std::vector<pollfd> pfds;
    for (int r = 0; r < nranks; ++r) {
      if (msg_pipes[r].rd >= 0) pfds.push_back(pollfd{msg_pipes[r].rd, POLLIN, 0});
    }
    if (!pfds.empty()) {
      poll(pfds.data(), pfds.size(), 200);
    } else {
      usleep(200 * 1000);
    }
    for (int r = 0; r < nranks; ++r) drain(r, false);

    const auto now = Clock::now();
    for (int r = 0; r < nranks; ++r) {
      if (!alive[r]) continue;
      int status = 0;
      pid_t got = waitpid(pids[r], &status, WNOHANG);
      if (got == pids[r]) {
        alive[r] = false;
        --live;
        RankOutcome& o = result.ranks[r];
        o.exited = WIFEXITED(status);
        o.exit_code = o.exited ? WEXITSTATUS(status) : -1;
        o.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        if (!o.ok() && first_failed < 0) {
          first_failed = r;
          have_grace_deadline = true;
          grace_deadline = now + std::chrono::seconds(options.kill_grace_s);
        }
        continue;
      }
      uint64_t beat = state->beats[r].load(std::memory_order_relaxed);
      if (beat != last_beat[r]) {
        last_beat[r] = beat;
        last_progress[r] = now;
      }
    }
    if (live == 0) break;

    std::string why;
    if (now >= total_deadline) {
      why = "the run exceeded its total timeout of " + std::to_string(options.total_timeout_s) +
            " s (hang?)";
    } else if (have_grace_deadline && now >= grace_deadline) {
      why = "rank " + std::to_string(first_failed) +
            " failed and this rank did not finish within " + std::to_string(options.kill_grace_s) +
            " s";
    } else if (options.idle_timeout_s > 0) {
      for (int r = 0; r < nranks && why.empty(); ++r) {
        if (alive[r] && now - last_progress[r] >= std::chrono::seconds(options.idle_timeout_s)) {
          why = "rank " + std::to_string(r) + " made no progress for " +
                std::to_string(options.idle_timeout_s) + " s (hang?)";
        }
      }
    }
    if (!why.empty()) {
      kill_alive(why);
      for (int r = 0; r < nranks; ++r) {
        if (!alive[r]) continue;
        int status = 0;
        waitpid(pids[r], &status, 0);
        alive[r] = false;
        result.ranks[r].exited = false;
        result.ranks[r].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      }
      live = 0;
    }
  }
  for (int r = 0; r < nranks; ++r) {
    drain(r, true);
    close_fd(msg_pipes[r].rd);
  }
  return result;
}

}  // namespace zgpu
