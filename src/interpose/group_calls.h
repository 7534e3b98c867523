// ncclGroupStart and ncclGroupEnd with zerocta's part (group_state.h says what waits for the
// outermost end): used by the wrappers, and by ncclCommInitAll's own group, which must count
// as the application's (its communicators join at its end).
#pragma once

#include <nccl.h>

#include "real_nccl.h"

namespace zc {

ncclResult_t group_start(const RealNccl& real);
ncclResult_t group_end(const RealNccl& real);

}  // namespace zc
