// A program that never touches NCCL or CUDA (and links neither). Under the shim it must not
// find libcuda or libnccl mapped: the shim loads nothing until an NCCL call arrives.
// Prints shim_loaded, libcuda_mapped, libnccl_mapped.
//
//   drv_no_nccl check SHIM   loads SHIM itself (RTLD_LOCAL, not preloaded), as zerocta-run
//                            --check does, calls zerocta_check_config(2) and prints its
//                            result as check_result before the mappings.
#include <dlfcn.h>

#include <fstream>
#include <string>

#include "driver_util.h"

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "check") {
    void* shim = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    auto* check =
        shim ? reinterpret_cast<int (*)(int)>(dlsym(shim, "zerocta_check_config")) : nullptr;
    drv::out("shim_loaded", check != nullptr ? 1 : 0);
    if (check != nullptr) drv::out("check_result", check(2));
  } else {
    drv::out("shim_loaded", dlsym(RTLD_DEFAULT, "zerocta_version") != nullptr ? 1 : 0);
  }
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
