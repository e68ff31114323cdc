#pragma once
// The attention benches' method and helpers, shared by bench/attention_gpu_bench.cpp and its FlashMLA peer
// (bench/peer/flashmla_peer.cu) so that both time the same way: CUDA events around each run, the median of
// `reps` runs after 3 warm-ups, a 256 MiB memset before each run to flush L2; and their allocation
// and filling helpers (any CUDA error ends the bench, naming the call).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CK(x)                                                                                             \
  do {                                                                                                    \
    cudaError_t e_ = (x);                                                                                 \
    if (e_ != cudaSuccess) {                                                                              \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, #x); \
      std::exit(1);                                                                                       \
    }                                                                                                     \
  } while (0)

namespace dsaserve::bench {

// Bytes memset before each timed run: larger than the H100's and H200's 50 MiB L2.
inline constexpr size_t kFlushBytes = size_t(256) << 20;

template <class T>
T* dev_alloc(size_t n) {
  void* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

template <class T>
T* upload(const std::vector<T>& v) {
  T* p = dev_alloc<T>(v.size());
  CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

// Fills n bytes at dst with `pattern` repeated (one upload, then device-to-device doubling; offsets stay
// multiples of the pattern's length, so a pattern of whole KV rows keeps the rows aligned).
inline void fill_device(void* dst, size_t n, const std::vector<unsigned char>& pattern) {
  const size_t first = std::min(n, pattern.size());
  CK(cudaMemcpy(dst, pattern.data(), first, cudaMemcpyHostToDevice));
  for (size_t done = first; done < n;) {
    const size_t c = std::min(done, n - done);
    CK(cudaMemcpy(static_cast<char*>(dst) + done, dst, c, cudaMemcpyDeviceToDevice));
    done += c;
  }
}

// Median time in microseconds of fn() over `reps` runs (3 warm-ups), each after an L2 flush of
// kFlushBytes at `flush`.
template <class F>
double time_us(F&& fn, void* flush, int reps = 20) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
  CK(cudaDeviceSynchronize());
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    CK(cudaMemsetAsync(flush, i & 0xff, kFlushBytes));
    CK(cudaEventRecord(a));
    fn();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]) * 1000.0;
}

// The KV rows both benches fill their latent pools with, kPatternRows random rows repeated (slot s holds row
// s % kPatternRows), so that both kernels see the same kind of data (the row maxima move from tile to
// tile, as with real keys; a constant cache would skip the online softmax's rescales):
// random_fp8_mla_rows: 656-byte rows (512 e4m3 codes with exponent < 15, 4 f32 scales in [0.01, 0.02),
// 64 bf16 rope values in [-1, 1]); random_bf16_rows: `values` bf16 values a row in [-1, 1].
inline constexpr int kPatternRows = 4096;
inline constexpr int kFp8MlaRowBytes = 656;

inline uint16_t bf16_bits(float v) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline std::vector<unsigned char> random_fp8_mla_rows(std::mt19937_64& rng) {
  std::vector<unsigned char> pat(size_t(kPatternRows) * kFp8MlaRowBytes);
  for (int r = 0; r < kPatternRows; ++r) {
    unsigned char* x = pat.data() + size_t(r) * kFp8MlaRowBytes;
    for (int i = 0; i < 512; ++i) x[i] = static_cast<unsigned char>(rng() & 0xf7u);  // exponent < 15
    for (int i = 0; i < 4; ++i) {
      const float s = 0.01f + float(rng() % 1000) * 1e-5f;
      std::memcpy(x + 512 + 4 * i, &s, 4);
    }
    for (int i = 0; i < 64; ++i) {
      const uint16_t b = bf16_bits(float(int64_t(rng() % 2001) - 1000) * 1e-3f);
      std::memcpy(x + 528 + 2 * i, &b, 2);
    }
  }
  return pat;
}

inline std::vector<unsigned char> random_bf16_rows(std::mt19937_64& rng, size_t values) {
  std::vector<unsigned char> pat(size_t(kPatternRows) * values * 2);
  for (size_t i = 0; i < pat.size(); i += 2) {
    const uint16_t b = bf16_bits(float(int64_t(rng() % 2001) - 1000) * 1e-3f);
    std::memcpy(pat.data() + i, &b, 2);
  }
  return pat;
}

}  // namespace dsaserve::bench
