#pragma once
// The FP8 index-key format on the CPU: the reference for the CUDA store kernel (bit-identical bytes) and
// the model of what an FP8 index-key cache holds, so that CPU-vs-GPU indexer tests compare like with like.
// Per key of `dim` values: scale = amax / 448 (1 when that is not positive: all zeros, or an f32-subnormal
// amax whose quotient underflows), codes[d] = e4m3_satfinite(k[d] / scale) (round to nearest even); the
// key reads back as e4m3(codes[d]) * scale. Cache bytes for n slots: codes [n, dim], then scales [n] f32.
#include <cstdint>

#include "core/tensor.h"

namespace dsaserve::kernels::cpu {

// Quantises one key: writes codes[0..dim) and returns its scale.
float indexer_key_fp8_quantize(const float* k, int64_t dim, uint8_t* codes);

// The bytes of an FP8 index-key cache whose slot i holds keys[i]: keys f32 [n, dim] -> u8 [n, dim + 4].
Tensor indexer_key_fp8_encode(const Tensor& keys);

// The keys such a cache holds: u8 [n, dim + 4] -> f32 [n, dim] (code times its key's scale).
Tensor indexer_key_fp8_decode(const Tensor& cache);

}  // namespace dsaserve::kernels::cpu
