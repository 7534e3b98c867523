// Does one cuPointerGetAttributes call answer what four cuPointerGetAttribute calls do, for every
// kind of memory a post describes (peer_memory.cc block_at)? One GPU: a cuMem allocation that
// allows POSIX fds, two mapped back to back in one reservation (PyTorch's expandable segments),
// cudaMalloc memory and pageable host memory, each asked at its start, inside and at its last
// byte. Prints one RESULT line per case: the four values both ways and whether they agree, and
// what a one-by-one query returned where it failed.
//
//   build/tests/gpu/zerocta_gpu_probe_pointer_attributes
// What it showed (H200, driver 580.159.04, docs/plots/lifecycle-2xH200/pointer-attributes-probe.txt):
// the same four values in every case; where one-by-one queries fail (reserved but unmapped,
// host memory) the single call succeeds with zeros, which block_at refuses as before.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_check.h"

namespace {

constexpr CUpointer_attribute kAsked[4] = {
    CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
    CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES};

struct Answer {
  unsigned long long v[4] = {};
  CUresult r[4] = {};
};

Answer one_by_one(CUdeviceptr p) {
  Answer a;
  for (int i = 0; i < 4; ++i) a.r[i] = cuPointerGetAttribute(&a.v[i], kAsked[i], p);
  return a;
}

Answer at_once(CUdeviceptr p, CUresult* r) {
  Answer a;
  CUdeviceptr base = 0;
  size_t bytes = 0;
  unsigned long long id = 0, types = 0;
  void* into[4] = {&base, &bytes, &id, &types};
  CUpointer_attribute which[4] = {kAsked[0], kAsked[1], kAsked[2], kAsked[3]};
  *r = cuPointerGetAttributes(4, which, into, p);
  a.v[0] = base;
  a.v[1] = bytes;
  a.v[2] = id;
  a.v[3] = types;
  return a;
}

int compare(const char* what, CUdeviceptr p) {
  const Answer one = one_by_one(p);
  CUresult r;
  const Answer all = at_once(p, &r);
  // block_at's rule: the first three must succeed one by one, else the memory is not cuMem.
  const bool cumem = one.r[0] == CUDA_SUCCESS && one.r[1] == CUDA_SUCCESS && one.r[2] == CUDA_SUCCESS &&
                     one.v[0] != 0 && one.v[1] != 0;
  bool same = r == CUDA_SUCCESS || !cumem;
  if (cumem && r == CUDA_SUCCESS)
    for (int i = 0; i < 4; ++i)
      same &= one.v[i] == all.v[i] || (i == 3 && one.r[3] != CUDA_SUCCESS);
  // Not cuMem: block_at must fail both ways (base or size 0 at once).
  if (!cumem) same = r != CUDA_SUCCESS || all.v[0] == 0 || all.v[1] == 0;
  printf("RESULT %-28s cumem=%d one_by_one=[%llx %llx %llu %llx] (r %d %d %d %d) at_once=[%llx %llx "
         "%llu %llx] (r %d) agree=%d\n",
         what, cumem, one.v[0], one.v[1], one.v[2], one.v[3], one.r[0], one.r[1], one.r[2],
         one.r[3], all.v[0], all.v[1], all.v[2], all.v[3], r, same);
  return same ? 0 : 1;
}

}  // namespace

int main() {
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const size_t seg = 10 * gran;  // 20 MiB on an H200, as PyTorch's segments
  CUdeviceptr va = 0;
  CU(cuMemAddressReserve(&va, 3 * seg, 0, 0, 0));
  CUmemGenericAllocationHandle h[2];
  for (int i = 0; i < 2; ++i) {
    CU(cuMemCreate(&h[i], seg, &prop, 0));
    CU(cuMemMap(va + i * seg, seg, 0, h[i], 0));
  }
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU(cuMemSetAccess(va, 2 * seg, &access, 1));
  void* legacy = nullptr;
  CK(cudaMalloc(&legacy, seg));
  std::vector<char> host(4096);
  int bad = 0;
  bad += compare("cumem first, start", va);
  bad += compare("cumem first, inside", va + seg / 2);
  bad += compare("cumem first, last byte", va + seg - 1);
  bad += compare("cumem second, start", va + seg);
  bad += compare("cumem second, inside", va + seg + 12345);
  bad += compare("reserved, unmapped", va + 2 * seg + 64);
  bad += compare("cudaMalloc", reinterpret_cast<CUdeviceptr>(legacy));
  bad += compare("host, pageable", reinterpret_cast<CUdeviceptr>(host.data()));
  printf("RESULT pointer_attributes disagreements=%d\n", bad);
  return bad ? 1 : 0;
}
