// Exercises the NCCL-like behaviour of the fake NCCL (tests/fake_nccl/fake_nccl_state.cc):
// one scenario per run, results printed as "key=value" (error codes as numbers), checked by
// test_fake_nccl_like.cc. The scenarios print what happened and leave the verdict to the test,
// so that they run unchanged with the shim preloaded; the driver itself fails (exit != 0)
// only when it cannot run the scenario.
//
//   drv_nccl_like grouped-init         init + split inside nested groups, queried on the way
//   drv_nccl_like queued-ops           every collective inside a group, nested groups, a comm
//                                      created in the same group, ncclGroupSimulateEnd
//   drv_nccl_like nonblocking          (FAKE_NCCL_NONBLOCKING=1) in-progress polls, refused
//                                      calls, split child written after the parent's polls,
//                                      grouped non-blocking init, abort while in progress
//   drv_nccl_like nonblocking-env      ncclCommInitRank without a config (NCCL_COMM_BLOCKING)
//   drv_nccl_like rendezvous-2proc [DELAY_MS]   fork: rank 1 enters every init DELAY_MS late
//   drv_nccl_like rendezvous-threads [DELAY_MS] the same with two threads of one process
//   drv_nccl_like fail-rank            fork: two ranks, blocking and grouped init
//   drv_nccl_like same-id              two ids and two comms from ncclGetUniqueId
//   drv_nccl_like same-id-rank RANK    one rank of a 2-rank comm, from its own unique id
//   drv_nccl_like inner-thread         (FAKE_NCCL_INNER_THREAD=1) a non-blocking init
#include <cuda.h>
#include <nccl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <chrono>
#include <string>
#include <thread>

#include "driver_util.h"

namespace {

using drv::out;

cudaStream_t stream() { return static_cast<cudaStream_t>(drv::fake_stream(1)); }
void* buf(int n) { return drv::fake_buffer(static_cast<uintptr_t>(n)); }
// Stands for "not written by NCCL" in an output slot.
ncclComm_t sentinel() { return reinterpret_cast<ncclComm_t>(uintptr_t{0x5e57}); }

std::string handle_state(ncclComm_t c) {
  return c == nullptr ? "null" : c == sentinel() ? "untouched" : "set";
}

long long now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool set_device(int dev) {
  CUcontext ctx = nullptr;
  return cuInit(0) == CUDA_SUCCESS && cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS &&
         cuCtxSetCurrent(ctx) == CUDA_SUCCESS;
}

// "<prefix>.rank.rc", "<prefix>.rank", the same for count and device (-77: not written).
void queries(const std::string& prefix, ncclComm_t c) {
  int v = -77;
  out(prefix + ".rank.rc", ncclCommUserRank(c, &v));
  out(prefix + ".rank", v);
  v = -77;
  out(prefix + ".count.rc", ncclCommCount(c, &v));
  out(prefix + ".count", v);
  v = -77;
  out(prefix + ".device.rc", ncclCommCuDevice(c, &v));
  out(prefix + ".device", v);
}

// Polls until the answer is not ncclInProgress (at most 1000 polls); prints how many polls
// answered ncclInProgress and the final answer. `slot`: also prints after which poll (1-based)
// NCCL wrote the handle there.
void poll_until_ready(const std::string& prefix, ncclComm_t c, ncclComm_t* slot = nullptr) {
  int in_progress = 0, written_at = 0;
  ncclResult_t state = ncclInProgress, rc = ncclSuccess;
  for (int i = 1; i <= 1000; ++i) {
    state = ncclInProgress;
    rc = ncclCommGetAsyncError(c, &state);
    if (slot != nullptr && written_at == 0 && *slot != nullptr && *slot != sentinel())
      written_at = i;
    if (rc != ncclSuccess || state != ncclInProgress) break;
    ++in_progress;
  }
  out(prefix + ".polls_in_progress", in_progress);
  out(prefix + ".poll_rc", rc);
  out(prefix + ".async", state);
  if (slot != nullptr) out(prefix + ".written_at_poll", written_at);
}

int grouped_init() {
  if (!set_device(2)) return 2;
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 2;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 1;
  out("group_start", ncclGroupStart());
  out("group_start.nested", ncclGroupStart());
  ncclComm_t c = sentinel();
  out("init", ncclCommInitRankConfig(&c, 4, id, 2, &cfg));
  out("init.handle", handle_state(c));
  queries("in_group", c);
  ncclResult_t async = ncclInProgress;
  out("in_group.async.rc", ncclCommGetAsyncError(c, &async));
  out("in_group.async", async);
  ncclComm_t child = sentinel();
  out("split", ncclCommSplit(c, 5, 0, &child, nullptr));
  out("split.handle.in_group", handle_state(child));
  drv::log_marker("inner-end");
  out("group_end.inner", ncclGroupEnd());
  queries("after_inner", c);
  out("split.handle.after_inner", handle_state(child));
  drv::log_marker("outer-end");
  out("group_end", ncclGroupEnd());
  drv::log_marker("after-group");
  queries("after", c);
  out("split.handle.after", handle_state(child));
  drv::print_stats("end");  // with a shim: which comms it saw created
  if (child != nullptr && child != sentinel()) {
    queries("child", child);
    out("destroy.child", ncclCommDestroy(child));
  }
  out("destroy", ncclCommDestroy(c));
  return 0;
}

int queued_ops() {
  ncclUniqueId id, id2;
  ncclComm_t c = nullptr, c2 = sentinel();
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclGetUniqueId(&id2) != ncclSuccess ||
      ncclCommInitRank(&c, 2, id, 0) != ncclSuccess)
    return 2;
  drv::log_marker("outside");
  out("outside.allreduce", ncclAllReduce(buf(1), buf(1), 10, ncclFloat32, ncclSum, c, stream()));
  drv::log_marker("group");
  out("group_start", ncclGroupStart());
  out("allgather", ncclAllGather(buf(2), buf(3), 11, ncclFloat32, c, stream()));
  out("allreduce", ncclAllReduce(buf(4), buf(4), 12, ncclFloat32, ncclSum, c, stream()));
  out("broadcast", ncclBroadcast(buf(5), buf(6), 13, ncclInt8, 1, c, stream()));
  out("reducescatter", ncclReduceScatter(buf(7), buf(8), 14, ncclFloat32, ncclMax, c, stream()));
  out("reduce", ncclReduce(buf(9), buf(10), 15, ncclFloat32, ncclMin, 0, c, stream()));
  out("send", ncclSend(buf(11), 16, ncclFloat32, 1, c, stream()));
  out("recv", ncclRecv(buf(12), 17, ncclFloat32, 1, c, stream()));
  out("alltoall", ncclAlltoAll(buf(13), buf(14), 18, ncclFloat32, c, stream()));
  out("gather", ncclGather(buf(15), buf(16), 19, ncclFloat32, 0, c, stream()));
  out("scatter", ncclScatter(buf(17), buf(18), 20, ncclFloat32, 0, c, stream()));
  out("bcast", ncclBcast(buf(19), 21, ncclInt8, 0, c, stream()));
  out("group_start.nested", ncclGroupStart());
  out("nested.allreduce", ncclAllReduce(buf(20), buf(20), 22, ncclFloat32, ncclSum, c, stream()));
  drv::log_marker("inner-end");
  out("group_end.inner", ncclGroupEnd());
  drv::log_marker("after-inner");
  // nccl-tests style: a comm created in this group is used in the same group.
  out("init2", ncclCommInitRank(&c2, 2, id2, 0));
  out("init2.allgather", ncclAllGather(buf(21), buf(22), 23, ncclFloat32, c2, stream()));
  drv::log_marker("outer-end");
  out("group_end", ncclGroupEnd());
  drv::log_marker("after-group");
  out("after.allreduce", ncclAllReduce(buf(23), buf(23), 24, ncclFloat32, ncclSum, c, stream()));
  drv::log_marker("simulate");
  out("sim.group_start", ncclGroupStart());
  out("sim.allreduce", ncclAllReduce(buf(24), buf(24), 25, ncclFloat32, ncclSum, c, stream()));
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  out("sim.end", ncclGroupSimulateEnd(&sim));
  drv::log_marker("end");
  out("destroy2", ncclCommDestroy(c2));
  out("destroy", ncclCommDestroy(c));
  return 0;
}

int nonblocking() {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 2;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t c = sentinel();
  out("init", ncclCommInitRankConfig(&c, 2, id, 1, &cfg));
  out("init.handle", handle_state(c));
  if (c == nullptr || c == sentinel()) return 0;
  queries("early", c);
  out("early.allreduce", ncclAllReduce(buf(1), buf(1), 8, ncclFloat32, ncclSum, c, stream()));
  out("early.destroy", ncclCommDestroy(c));
  out("early.finalize", ncclCommFinalize(c));
  poll_until_ready("init", c);
  drv::print_stats("ready");  // with a shim: which comms it has seen created so far
  queries("ready", c);
  out("ready.allreduce", ncclAllReduce(buf(1), buf(1), 8, ncclFloat32, ncclSum, c, stream()));

  // A split of a non-blocking parent: the parent runs it, the handle comes later.
  ncclComm_t child = sentinel();
  out("split", ncclCommSplit(c, 3, 0, &child, nullptr));
  out("split.handle.after_call", handle_state(child));
  out("split.parent_allreduce",
      ncclAllReduce(buf(1), buf(1), 8, ncclFloat32, ncclSum, c, stream()));
  poll_until_ready("split", c, &child);
  out("split.handle.after_polls", handle_state(child));
  drv::print_stats("split");
  if (child != nullptr && child != sentinel()) {
    queries("child", child);
    out("child.destroy", ncclCommDestroy(child));
  }

  // Inside a group the non-blocking init is deferred; the group end starts it.
  ncclUniqueId id2;
  ncclComm_t g = sentinel();
  if (ncclGetUniqueId(&id2) != ncclSuccess) return 2;
  out("grouped.group_start", ncclGroupStart());
  out("grouped.init", ncclCommInitRankConfig(&g, 2, id2, 0, &cfg));
  out("grouped.group_end", ncclGroupEnd());
  if (g != nullptr && g != sentinel()) {
    poll_until_ready("grouped", g);
    drv::print_stats("grouped");
    out("grouped.destroy", ncclCommDestroy(g));
  }

  // Abort does not wait for the init.
  ncclUniqueId id3;
  ncclComm_t a = sentinel();
  if (ncclGetUniqueId(&id3) != ncclSuccess) return 2;
  out("abort.init", ncclCommInitRankConfig(&a, 2, id3, 0, &cfg));
  if (a != nullptr && a != sentinel()) out("abort", ncclCommAbort(a));
  drv::print_stats("end");
  out("destroy", ncclCommDestroy(c));
  return 0;
}

int nonblocking_env() {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 2;
  ncclComm_t c = sentinel();
  out("init", ncclCommInitRank(&c, 2, id, 0));
  if (c == nullptr || c == sentinel()) return 0;
  poll_until_ready("init", c);
  out("destroy", ncclCommDestroy(c));
  return 0;
}

// One rank of the rendezvous scenarios; rank 1 enters every init delay_ms late.
void rendezvous_rank(int rank, const ncclUniqueId& id, const ncclUniqueId& id2, int delay_ms) {
  const std::string p = "r" + std::to_string(rank);
  if (rank == 1) usleep(static_cast<useconds_t>(delay_ms) * 1000);
  long long t0 = now_ms();
  ncclComm_t c = nullptr;
  out(p + ".init", ncclCommInitRank(&c, 2, id, rank));
  out(p + ".init_ms", now_ms() - t0);
  if (c == nullptr) return;
  queries(p + ".comm", c);
  // Both ranks in one child, ordered by key (descending rank).
  ncclComm_t both = nullptr;
  out(p + ".split", ncclCommSplit(c, 0, -rank, &both, nullptr));
  if (both != nullptr) queries(p + ".split", both);
  // Each rank alone.
  ncclComm_t alone = nullptr;
  out(p + ".split_alone", ncclCommSplit(c, 10 + rank, 0, &alone, nullptr));
  if (alone != nullptr) queries(p + ".split_alone", alone);
  // Rank 0 keeps itself only (an excluded rank does not call shrink).
  ncclComm_t shrunk = nullptr;
  if (rank == 0) {
    int excluded[1] = {1};
    out(p + ".shrink", ncclCommShrink(c, excluded, 1, &shrunk, nullptr, NCCL_SHRINK_DEFAULT));
    if (shrunk != nullptr) queries(p + ".shrink", shrunk);
  }
  // A grouped init returns at once and waits at the group end.
  ncclComm_t g = nullptr;
  if (rank == 1) usleep(static_cast<useconds_t>(delay_ms) * 1000);
  out(p + ".group_start", ncclGroupStart());
  t0 = now_ms();
  out(p + ".group_init", ncclCommInitRank(&g, 2, id2, rank));
  out(p + ".group_init_ms", now_ms() - t0);
  out(p + ".group_allreduce", ncclAllReduce(buf(1), buf(1), 8, ncclFloat32, ncclSum, g, stream()));
  t0 = now_ms();
  out(p + ".group_end", ncclGroupEnd());
  out(p + ".group_end_ms", now_ms() - t0);
  if (g != nullptr) queries(p + ".group", g);
  for (ncclComm_t x : {g, shrunk, alone, both, c})
    if (x != nullptr) ncclCommDestroy(x);
}

int rendezvous_2proc(int delay_ms) {
  ncclUniqueId id, id2;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclGetUniqueId(&id2) != ncclSuccess) return 2;
  out("id", drv::hex(id.internal, 16));
  pid_t pid = fork();
  if (pid < 0) return 3;
  if (pid == 0) {
    rendezvous_rank(1, id, id2, delay_ms);
    _exit(0);
  }
  rendezvous_rank(0, id, id2, delay_ms);
  int status = 0;
  waitpid(pid, &status, 0);
  out("child_exit", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  return 0;
}

int rendezvous_threads(int delay_ms) {
  ncclUniqueId id, id2;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclGetUniqueId(&id2) != ncclSuccess) return 2;
  std::thread t1([&] { rendezvous_rank(1, id, id2, delay_ms); });
  rendezvous_rank(0, id, id2, delay_ms);
  t1.join();
  return 0;
}

int fail_rank() {
  ncclUniqueId id, id2;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclGetUniqueId(&id2) != ncclSuccess) return 2;
  pid_t pid = fork();
  if (pid < 0) return 3;
  const int rank = pid == 0 ? 1 : 0;
  const std::string p = "r" + std::to_string(rank);
  long long t0 = now_ms();
  ncclComm_t c = sentinel();
  out(p + ".init", ncclCommInitRank(&c, 2, id, rank));
  out(p + ".init_ms", now_ms() - t0);
  out(p + ".init.handle", handle_state(c));
  ncclComm_t g = sentinel();
  out(p + ".group_start", ncclGroupStart());
  out(p + ".group_init", ncclCommInitRank(&g, 2, id2, rank));
  t0 = now_ms();
  out(p + ".group_end", ncclGroupEnd());
  out(p + ".group_end_ms", now_ms() - t0);
  if (g != nullptr && g != sentinel()) {
    ncclResult_t async = ncclSuccess;
    out(p + ".group.async.rc", ncclCommGetAsyncError(g, &async));
    out(p + ".group.async", async);
    out(p + ".group.abort", ncclCommAbort(g));
  }
  if (pid == 0) _exit(0);
  int status = 0;
  waitpid(pid, &status, 0);
  out("child_exit", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  return 0;
}

int same_id() {
  ncclUniqueId a, b;
  out("id_a.rc", ncclGetUniqueId(&a));
  out("id_b.rc", ncclGetUniqueId(&b));
  out("same_bytes", memcmp(&a, &b, sizeof a) == 0 ? 1 : 0);
  out("id_a", drv::hex(a.internal, 16));
  ncclComm_t c1 = nullptr, c2 = nullptr;
  out("init1", ncclCommInitRank(&c1, 1, a, 0));
  out("init2", ncclCommInitRank(&c2, 1, a, 0));
  out("distinct_comms", c1 != nullptr && c2 != nullptr && c1 != c2 ? 1 : 0);
  if (c1) ncclCommDestroy(c1);
  if (c2) ncclCommDestroy(c2);
  return 0;
}

// One process per rank, each with its own ncclGetUniqueId (FAKE_NCCL_COMM_ID makes them agree).
int same_id_rank(int rank) {
  ncclUniqueId id;
  out("id.rc", ncclGetUniqueId(&id));
  out("id", drv::hex(id.internal, 16));
  long long t0 = now_ms();
  ncclComm_t c = nullptr;
  out("init", ncclCommInitRank(&c, 2, id, rank));
  out("init_ms", now_ms() - t0);
  if (c != nullptr) {
    queries("comm", c);
    out("destroy", ncclCommDestroy(c));
  }
  return 0;
}

int inner_thread() {
  out("main_tid", static_cast<long long>(syscall(SYS_gettid)));
  drv::print_stats("before");
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 2;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t c = sentinel();
  out("init", ncclCommInitRankConfig(&c, 2, id, 0, &cfg));
  if (c == nullptr || c == sentinel()) return 0;
  poll_until_ready("init", c);
  drv::print_stats("after");
  out("destroy", ncclCommDestroy(c));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: drv_nccl_like SCENARIO [DELAY_MS | RANK]\n");
    return 64;
  }
  const std::string s = argv[1];
  const int delay_ms = argc > 2 ? atoi(argv[2]) : 300;
  if (s == "grouped-init") return grouped_init();
  if (s == "queued-ops") return queued_ops();
  if (s == "nonblocking") return nonblocking();
  if (s == "nonblocking-env") return nonblocking_env();
  if (s == "rendezvous-2proc") return rendezvous_2proc(delay_ms);
  if (s == "rendezvous-threads") return rendezvous_threads(delay_ms);
  if (s == "fail-rank") return fail_rank();
  if (s == "same-id") return same_id();
  if (s == "same-id-rank" && argc > 2) return same_id_rank(atoi(argv[2]));
  if (s == "inner-thread") return inner_thread();
  fprintf(stderr, "drv_nccl_like: unknown scenario %s\n", argv[1]);
  return 64;
}
