// A program that links no NCCL and calls ncclGetVersion COUNT times through the process's
// global symbol lookup, i.e. through the preloaded shim, which then has to find an NCCL by
// itself (ZEROCTA_NCCL_LIBRARY). Prints "call.<i>=<ncclResult_t>" and "version=<code>", or
// "shim=absent" when nothing exports ncclGetVersion.
//
//   bad_input_dlsym_driver COUNT
#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <string>

#include "driver_util.h"

int main(int argc, char** argv) {
  const int count = argc > 1 ? atoi(argv[1]) : 1;
  using GetVersion = ncclResult_t (*)(int*);
  auto get = reinterpret_cast<GetVersion>(dlsym(RTLD_DEFAULT, "ncclGetVersion"));
  if (get == nullptr) {
    drv::out("shim", "absent");
    return 0;
  }
  int version = 0;
  for (int i = 0; i < count; ++i) drv::out("call." + std::to_string(i), get(&version));
  drv::out("version", version);
  return 0;
}
