#include "group_state.h"

namespace zc {

GroupState& group_state() {
  static thread_local GroupState g;
  return g;
}

}  // namespace zc
