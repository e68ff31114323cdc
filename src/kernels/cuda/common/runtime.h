#pragma once
// CUDA device runtime: device discovery, the device allocator behind Tensor::empty(..., Device::cuda),
// and error checking. Declared in plain C++ so CPU-only code can include it; defined in runtime.cu.
#include <cstddef>
#include <string>

#include "core/tensor.h"

namespace dsaserve::kernels::cuda {

// Number of visible CUDA devices; 0 when there is no driver or no device (never throws).
int device_count();
// "NVIDIA H200, sm_90, 139.8 GiB" or the reason there is none.
std::string device_summary();
// Installs the caching CUDA allocator (allocator.h) for Device::cuda tensors (idempotent). Throws when no
// device is present. The operator backend is installed separately (backend.h).
void install();

}  // namespace dsaserve::kernels::cuda
