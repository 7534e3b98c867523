// A lower layer that includes an upper one: the check must fail here (tests/layering).
#pragma once
#include "high.h"
