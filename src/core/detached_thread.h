// A detached thread of the library's own (the fd service, housekeeping): it starts with every
// signal blocked, so no handler of the application ever runs on it, not even before it could
// block them itself.
#pragma once

namespace zc {

// Starts `fn(arg)` on a detached thread named `name` (at most 15 characters); 0 or the
// pthread_create error. The name is set before this returns, so it is there for whoever
// looks at the thread right after.
int start_detached_thread(void* (*fn)(void*), void* arg, const char* name);

}  // namespace zc
