// A core source that includes a communicator's header: must not preprocess (tests/layering).
#include "comm_state.h"
