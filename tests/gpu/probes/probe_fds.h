// What the cross-process probes share: passing descriptors over a UNIX socket (SCM_RIGHTS)
// and the properties of an exportable cuMem allocation. Header-only, for nvcc or g++.
#pragma once

#include <cuda.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

inline void send_fds(int sock, const std::vector<int>& fds) {
  char dummy = 'x';
  iovec iov{&dummy, 1};
  std::vector<char> ctl(CMSG_SPACE(sizeof(int) * fds.size()));
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctl.data();
  m.msg_controllen = ctl.size();
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  if (sendmsg(sock, &m, 0) < 0) perror("sendmsg");
}

inline std::vector<int> recv_fds(int sock, size_t n) {
  char dummy;
  iovec iov{&dummy, 1};
  std::vector<char> ctl(CMSG_SPACE(sizeof(int) * n));
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctl.data();
  m.msg_controllen = ctl.size();
  if (recvmsg(sock, &m, 0) < 0) perror("recvmsg");
  std::vector<int> fds(n, -1);
  const cmsghdr* c = CMSG_FIRSTHDR(&m);
  if (c && c->cmsg_len >= CMSG_LEN(sizeof(int) * n))
    memcpy(fds.data(), CMSG_DATA(c), sizeof(int) * n);
  return fds;
}

// Maps allocation `h` (`bytes`, whole) at a new address *va with read/write access for device
// `dev`. The first failing driver call's result, or CUDA_SUCCESS.
inline CUresult map_for_device(CUmemGenericAllocationHandle h, size_t bytes, int dev,
                               CUdeviceptr* va) {
  CUresult r = cuMemAddressReserve(va, bytes, 0, 0, 0);
  if (r == CUDA_SUCCESS) r = cuMemMap(*va, bytes, 0, h, 0);
  if (r != CUDA_SUCCESS) return r;
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = dev;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return cuMemSetAccess(*va, bytes, &a, 1);
}

inline CUmemAllocationProp prop(int dev) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

// The number of visible GPUs, counted in a forked child so that the caller (which forks the
// probe's processes later) makes no CUDA call; -1 if the child could not answer.
inline int count_gpus_in_child() {
  int p[2];
  if (pipe(p) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    int c = 0;
    if (cuInit(0) == CUDA_SUCCESS) cuDeviceGetCount(&c);
    _exit(write(p[1], &c, sizeof c) == sizeof c ? 0 : 1);
  }
  close(p[1]);
  int n = -1;
  if (pid < 0 || read(p[0], &n, sizeof n) != sizeof n) n = -1;
  close(p[0]);
  if (pid > 0) waitpid(pid, nullptr, 0);
  return n;
}

// Runs a(sock) and b(sock) in two forked processes joined by a UNIX socket pair (fork before any
// CUDA call: each child makes its own context); true when both exited 0. Children end with
// _exit, so unbuffer stdout first.
template <class A, class B>
bool run_pair(A a, B b) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return false;
  const pid_t pa = fork();
  if (pa == 0) {
    close(sv[1]);
    a(sv[0]);
    _exit(0);
  }
  const pid_t pb = fork();
  if (pb == 0) {
    close(sv[0]);
    b(sv[1]);
    _exit(0);
  }
  close(sv[0]);
  close(sv[1]);
  int sa = 0, sb = 0;
  waitpid(pa, &sa, 0);
  waitpid(pb, &sb, 0);
  return WIFEXITED(sa) && WEXITSTATUS(sa) == 0 && WIFEXITED(sb) && WEXITSTATUS(sb) == 0;
}
