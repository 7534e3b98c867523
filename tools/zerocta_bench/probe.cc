#include "probe.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace zcb {

namespace {

std::string read_driver_version() {
  std::ifstream f("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(f, line)) return "";
  // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue ..." -> first dotted number.
  std::istringstream words(line);
  std::string w;
  while (words >> w)
    if (!w.empty() && isdigit(static_cast<unsigned char>(w[0])) && w.find('.') != std::string::npos)
      return w;
  return "";
}

// The child: one "key<TAB>fields" line per fact.
void probe_child(int fd) {
  std::string out;
  char buf[512];
  int v = 0;
  if (ncclGetVersion(&v) == ncclSuccess) out += "nccl\t" + std::to_string(v) + "\n";
  if (cudaDriverGetVersion(&v) == cudaSuccess) out += "driver\t" + std::to_string(v) + "\n";
  if (cudaRuntimeGetVersion(&v) == cudaSuccess) out += "runtime\t" + std::to_string(v) + "\n";
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    out += std::string("error\t") + cudaGetErrorString(e) + "\n";
    n = 0;
  }
  out += "count\t" + std::to_string(n) + "\n";
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    char bus[32] = "?";
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    cudaDeviceGetPCIBusId(bus, sizeof(bus), i);
    snprintf(buf, sizeof(buf), "gpu\t%s\t%s\t%zu\n", p.name, bus, p.totalGlobalMem);
    out += buf;
    for (int j = 0; j < n; ++j) {
      int can = 1;
      if (i != j && cudaDeviceCanAccessPeer(&can, i, j) == cudaSuccess && !can)
        out += "nop2p\t" + std::to_string(i) + "->" + std::to_string(j) + "\n";
    }
  }
  size_t off = 0;
  while (off < out.size()) {
    ssize_t w = write(fd, out.data() + off, out.size() - off);
    if (w <= 0) break;
    off += static_cast<size_t>(w);
  }
}

void parse_probe(const std::string& text, MachineInfo* m) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::vector<std::string> f;
    std::istringstream fields(line);
    std::string x;
    while (std::getline(fields, x, '\t')) f.push_back(x);
    if (f.size() < 2) continue;
    if (f[0] == "nccl") m->nccl_version = atoi(f[1].c_str());
    if (f[0] == "driver") m->cuda_driver_version = atoi(f[1].c_str());
    if (f[0] == "runtime") m->cuda_runtime_version = atoi(f[1].c_str());
    if (f[0] == "error") m->no_gpu_reason = f[1];
    if (f[0] == "count") m->gpu_count = atoi(f[1].c_str());
    if (f[0] == "nop2p") m->p2p_missing.push_back(f[1]);
    if (f[0] == "gpu" && f.size() >= 4)
      m->gpus.push_back({f[1], f[2], static_cast<uint64_t>(strtoull(f[3].c_str(), nullptr, 10))});
  }
}

}  // namespace

MachineInfo probe_machine(int timeout_s) {
  MachineInfo m;
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  m.hostname = host;
  m.driver_version = read_driver_version();

  int fds[2];
  if (pipe(fds) != 0) {
    m.no_gpu_reason = "pipe() failed";
    return m;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    probe_child(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    m.no_gpu_reason = "fork() failed";
    return m;
  }
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  bool timed_out = false;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[4096];
    ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  parse_probe(text, &m);
  if (timed_out) {
    m.gpu_count = 0;
    m.no_gpu_reason = "the GPU probe did not answer within " + std::to_string(timeout_s) + " s";
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    m.gpu_count = 0;
    m.no_gpu_reason = "the GPU probe process crashed (CUDA driver unusable?)";
  } else if (m.gpu_count == 0 && m.no_gpu_reason.empty()) {
    m.no_gpu_reason = "cudaGetDeviceCount returned 0";
  }
  return m;
}

MachineInfo fake_machine(int ngpus) {
  MachineInfo m;
  m.fake = true;
  m.gpu_count = ngpus;
  m.hostname = "fake-host";
  m.driver_version = "0.0 (fake)";
  m.nccl_version = 22809;
  for (int i = 0; i < ngpus; ++i) m.gpus.push_back({"Fake GPU (no CUDA)", "fake", 0});
  return m;
}

std::string nccl_version_string(int code) {
  if (code <= 0) return "unknown";
  // NCCL_VERSION(X,Y,Z): X*10000 + Y*100 + Z since 2.9 (X*1000 + Y*100 + Z before).
  int major = code >= 10000 ? code / 10000 : code / 1000;
  int minor = code >= 10000 ? (code % 10000) / 100 : (code % 1000) / 100;
  int patch = code % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

std::string cuda_version_string(int code) {
  if (code <= 0) return "unknown";
  return std::to_string(code / 1000) + "." + std::to_string((code % 1000) / 10);
}

}  // namespace zcb
