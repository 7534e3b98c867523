// A program that never touches NCCL or CUDA (and links neither). Under the shim it must not
// find libcuda or libnccl mapped: the shim loads nothing until an NCCL call arrives.
// Prints shim_loaded, libcuda_mapped, libnccl_mapped.
#include <dlfcn.h>

#include <fstream>
#include <string>

#include "driver_util.h"

int main() {
  drv::out("shim_loaded", dlsym(RTLD_DEFAULT, "zerocta_version") != nullptr ? 1 : 0);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  bool cuda = false, nccl = false;
  while (std::getline(maps, line)) {
    if (line.find("libcuda") != std::string::npos) cuda = true;
    if (line.find("libnccl") != std::string::npos) nccl = true;
  }
  drv::out("libcuda_mapped", cuda ? 1 : 0);
  drv::out("libnccl_mapped", nccl ? 1 : 0);
  return 0;
}
