#include "nccl_reference.h"

#include <dlfcn.h>
#include <link.h>

#include <cstring>
#include <string>

#include "cuda_check.h"

namespace zcb {

struct NcclReference::Api {
  ncclResult_t (*get_unique_id)(ncclUniqueId*);
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*group_start)();
  ncclResult_t (*group_end)();
  ncclResult_t (*reduce_scatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                 ncclComm_t, cudaStream_t);
  ncclResult_t (*comm_finalize)(ncclComm_t);
  ncclResult_t (*comm_destroy)(ncclComm_t);
  PreMulCalls premul;
};

namespace {

// The path of the loaded libnccl (the one this binary links), from the loaded objects.
int find_nccl(struct dl_phdr_info* info, size_t, void* data) {
  const char* name = info->dlpi_name;
  if (!name || !*name) return 0;
  const char* base = strrchr(name, '/');
  base = base ? base + 1 : name;
  if (strncmp(base, "libnccl.so", 10) != 0) return 0;
  *static_cast<std::string*>(data) = name;
  return 1;
}

template <typename Fn>
void resolve(void* lib, const char* name, Fn* out) {
  void* sym = dlsym(lib, name);
  if (!sym) fatal("%s not found in the loaded libnccl: %s", name, dlerror());
  *out = reinterpret_cast<Fn>(sym);
}

#define ZCB_REAL_NCCL(call)                                                               \
  do {                                                                                    \
    ncclResult_t r_ = (call);                                                             \
    if (r_ != ncclSuccess)                                                                \
      ::zcb::fatal("reference %s failed: %s (%d) (%s:%d)", #call, ncclGetErrorString(r_), \
                   static_cast<int>(r_), __FILE__, __LINE__);                             \
  } while (0)

}  // namespace

namespace {
const NcclReference::Api* real_nccl_api() {
  static NcclReference::Api api;
  static bool done = false;
  if (done) return &api;
  std::string path;
  dl_iterate_phdr(find_nccl, &path);
  if (path.empty()) fatal("no libnccl.so among the loaded objects: no reference reduce-scatter");
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (!lib) fatal("dlopen(%s, RTLD_NOLOAD): %s", path.c_str(), dlerror());
  // dlsym on the library's own handle finds its definitions, never a preloaded shim's.
  resolve(lib, "ncclGetUniqueId", &api.get_unique_id);
  resolve(lib, "ncclCommInitRank", &api.comm_init_rank);
  resolve(lib, "ncclGroupStart", &api.group_start);
  resolve(lib, "ncclGroupEnd", &api.group_end);
  resolve(lib, "ncclReduceScatter", &api.reduce_scatter);
  resolve(lib, "ncclCommFinalize", &api.comm_finalize);
  resolve(lib, "ncclCommDestroy", &api.comm_destroy);
  resolve(lib, "ncclRedOpCreatePreMulSum", &api.premul.create);
  resolve(lib, "ncclRedOpDestroy", &api.premul.destroy);
  done = true;
  return &api;
}
}  // namespace

NcclReference::NcclReference(const std::vector<int>& ranks, int nranks, RedOp red,
                             ncclDataType_t type, Channel* ch)
    : api_(real_nccl_api()),
      ranks_(ranks),
      nranks_(nranks),
      comms_(ranks.size(), nullptr),
      scalars_(red, type, ranks, nranks) {
  const bool every = static_cast<int>(ranks.size()) == nranks;
  ncclUniqueId id;
  if (ranks.front() == 0) {
    ZCB_REAL_NCCL(api_->get_unique_id(&id));
    if (!every) {
      UniqueIdMsg m;
      memcpy(m.bytes, id.internal, sizeof(m.bytes));
      ch->send(kMsgUniqueId, &m, sizeof(m));
    }
  } else {
    UniqueIdMsg m;
    if (!ch->receive(kMsgUniqueIdFwd, &m, sizeof(m)))
      fatal("no NCCL unique id for the reference communicator from the parent");
    memcpy(id.internal, m.bytes, sizeof(m.bytes));
  }
  const bool group = ranks.size() > 1;
  if (group) ZCB_REAL_NCCL(api_->group_start());
  for (size_t i = 0; i < ranks.size(); ++i) {
    ZCB_CUDA(cudaSetDevice(ranks[i]));
    ZCB_REAL_NCCL(api_->comm_init_rank(&comms_[i], nranks, id, ranks[i]));
  }
  if (group) ZCB_REAL_NCCL(api_->group_end());
}

void NcclReference::reduce_scatter(const std::vector<const void*>& send,
                                   const std::vector<void*>& recv, size_t count,
                                   ncclDataType_t type, RedOp red,
                                   const std::vector<cudaStream_t>& streams) {
  const bool group = comms_.size() > 1;
  if (group) ZCB_REAL_NCCL(api_->group_start());
  for (size_t i = 0; i < comms_.size(); ++i) {
    if (group) ZCB_CUDA(cudaSetDevice(ranks_[i]));
    const CallRedOp op(api_->premul, red, type, ranks_[i], nranks_, comms_[i], scalars_.get(i));
    ZCB_REAL_NCCL(
        api_->reduce_scatter(send[i], recv[i], count, type, op.get(), comms_[i], streams[i]));
  }
  if (group) ZCB_REAL_NCCL(api_->group_end());
}

NcclReference::~NcclReference() {
  if (comms_.size() > 1) {
    api_->group_start();
    for (ncclComm_t c : comms_)
      if (c) api_->comm_finalize(c);
    api_->group_end();
  }
  for (ncclComm_t c : comms_)
    if (c) api_->comm_destroy(c);
}

}  // namespace zcb
