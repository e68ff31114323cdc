#pragma once
// The current device's one cuBLASLt handle (made with the linears' per-device state, gemm.cpp), shared by
// every cuBLASLt user of the backend (the linears, the absorbed-MLA batched GEMMs).
#include <cublasLt.h>

namespace dsaserve::kernels::cuda {

cublasLtHandle_t device_lt_handle();

}  // namespace dsaserve::kernels::cuda
