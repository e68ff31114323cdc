#pragma once
// The CUDA operator backend: registers kernels::Backend for Device::cuda so that the model's calls on CUDA
// tensors run on the GPU (kernels/ops.h). GEMMs through cuBLASLt (gemm.h), the rest as CUDA kernels.
// Every operator runs on the legacy default stream; results are ready for the next operator without syncs.
#include "kernels/ops.h"

namespace dsaserve::kernels::cuda {

// Installs the caching allocator (runtime.h) and registers the CUDA backend (idempotent). Throws when no
// CUDA device is present.
void install_backend();
// The backend object itself (for tests that call it directly).
Backend& cuda_backend();

}  // namespace dsaserve::kernels::cuda
