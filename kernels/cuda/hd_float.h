// The CUDA kernels' name for kernels/hd_float.h, which moved beside half_float.h so that the CPU
// kernels can share its arithmetic too (kernels/hqq_fit.h).
#pragma once
#include "kernels/hd_float.h"
