// Loads NCCL the PyTorch way: dlopen(RTLD_NOW | RTLD_LOCAL) of an extension library that has
// libnccl.so.2 as a dependency, then collectives through that extension. This program does
// not link NCCL. Prints each result and the shim's counters.
//
//   drv_torch_ext <path of libfake_torch_ext.so>
#include <dlfcn.h>

#include "driver_util.h"

int main(int argc, char** argv) {
  if (argc < 2) return 64;
  void* ext = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (ext == nullptr) {
    fprintf(stderr, "driver: %s\n", dlerror());
    return 2;
  }
  // NCCL must not have become globally visible: that is the point of this scenario.
  drv::out("nccl_global", dlsym(RTLD_DEFAULT, "pncclAllGather") != nullptr ? 1 : 0);

  using Init = int (*)(int, int);
  using Coll = int (*)(const void*, void*, size_t, void*);
  using Bcast = int (*)(void*, size_t, int, void*);
  using Destroy = int (*)();
  auto init = reinterpret_cast<Init>(dlsym(ext, "ext_init"));
  auto allgather = reinterpret_cast<Coll>(dlsym(ext, "ext_allgather"));
  auto allreduce = reinterpret_cast<Coll>(dlsym(ext, "ext_allreduce"));
  auto bcast = reinterpret_cast<Bcast>(dlsym(ext, "ext_bcast"));
  auto destroy = reinterpret_cast<Destroy>(dlsym(ext, "ext_destroy"));
  if (!init || !allgather || !allreduce || !bcast || !destroy) return 3;

  drv::out("init", init(2, 1));
  drv::out("allgather",
           allgather(drv::fake_buffer(1), drv::fake_buffer(2), 1000, drv::fake_stream(1)));
  drv::out("allreduce",
           allreduce(drv::fake_buffer(3), drv::fake_buffer(4), 2000, drv::fake_stream(1)));
  drv::out("bcast", bcast(drv::fake_buffer(5), 3000, 0, drv::fake_stream(1)));
  drv::print_stats("end");
  drv::out("destroy", destroy());
  return 0;
}
