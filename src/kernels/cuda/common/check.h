#pragma once
// DSA_CUDA_CHECK(expr): throws dsaserve::Error naming the call, file and line when a CUDA call fails.
// Host C++ only (.cpp); kernels in .cu files return cudaError_t to their .cpp caller.
#include <cuda_runtime.h>

#include "core/error.h"

#define DSA_CUDA_CHECK(expr)                                                                              \
  do {                                                                                                    \
    cudaError_t _e = (expr);                                                                              \
    if (_e != cudaSuccess) {                                                                              \
      ::dsaserve::fail("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(_e), cudaGetErrorString(_e), \
                       #expr, __FILE__, __LINE__);                                                        \
    }                                                                                                     \
  } while (0)
