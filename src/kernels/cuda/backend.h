#pragma once
// The CUDA operator backend: registers kernels::Backend for Device::cuda so that the model's calls on CUDA
// tensors run on the GPU (kernels/ops.h). GEMMs through cuBLASLt (gemm.h), the rest as CUDA kernels.
// Every operator runs on its device's compute stream (common/device_context.h; op_stream()); results are
// ready for the next operator without syncs, and for the legacy stream's copies (a blocking stream).
#include <memory>

#include "kernels/ops.h"

namespace dsaserve::kernels::cuda {

// Installs the caching allocator (runtime.h) and registers the CUDA backend with the default KernelOptions
// (idempotent; the free operators of ops.h use it). Throws when no CUDA device is present.
void install_backend();
// The current device's default-options backend object (one per device ordinal; the one install_backend
// registers for the free operators is the installing thread's device's; for tests that call it directly).
Backend& cuda_backend();
// A CUDA backend of its own for the calling thread's current device (its ordinal()) running its kernels
// with `options` (a model's device context: runtime::model_on_device); installs the allocator first.
std::shared_ptr<Backend> make_backend(const KernelOptions& options);

}  // namespace dsaserve::kernels::cuda
