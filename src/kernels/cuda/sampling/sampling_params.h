#pragma once
// Plain parameters of the GPU sampler (sampling.cu). The host wrapper (sampling.cpp) validates the
// per-row requests, packs them into one device buffer and launches; see sampling.h for the semantics.
#include <cuda_runtime.h>

#include <cstdint>

namespace dsaserve::kernels::cuda {

inline constexpr int kSampleMaxTopLogprobs = 20;
// Largest vocabulary the kernels take (the fixed-point probability sums need V * 2^44 < 2^64).
inline constexpr int64_t kSampleMaxVocab = int64_t(1) << 20;
// Rows a call keeps weight caches for (8 bytes a token each); further rows recompute their weights.
inline constexpr int32_t kSampleWeightCacheRows = 32;

// One row's request. Offsets index the packed lists of SampleKernelParams.
struct SampleRowDesc {
  double uniform;  // the draw in [0, 1) (used when temperature > 0)
  float temperature, top_p, min_p;
  float presence, frequency, repetition;
  int32_t top_k;               // <= 0 or >= vocab: no limit
  int32_t top_logprobs;        // [0, kSampleMaxTopLogprobs]
  int32_t logprob;             // 1: report the sampled token's log-probability (and lse)
  int32_t bias_off, bias_n;    // logit_bias entries, applied in order
  int32_t seen_off, seen_n;    // distinct prompt + output tokens (repetition penalty)
  int32_t count_off, count_n;  // distinct output tokens and their counts (presence / frequency)
  int32_t ws_row;              // row of `ws` holding the processed logits; -1: the row has no penalty or bias
  int32_t wc_row;              // row of `wcache` for the weights (top_p / min_p without top_k); -1: none
};

struct SampleKernelParams {
  const float* logits;  // [rows, vocab] stride `stride`
  int64_t rows, vocab, stride;
  const SampleRowDesc* desc;  // [rows]
  const int32_t* bias_tok;    // packed lists (device)
  const float* bias_val;
  const int32_t* seen_tok;
  const int32_t* count_tok;
  const int32_t* count_n;
  float* ws;                   // [rows with ws_row >= 0, vocab] processed logits
  unsigned long long* wcache;  // [rows with wc_row >= 0, vocab] the rows' fixed-point weights, kept
                               // between the radix select's passes
  // Grid pre-pass (small batches): each row split into `parts` chunks of ceil(vocab / parts) ids, one
  // block each: the chunk's (value, lower id) maximum of the processed logits, then (rows with
  // temperature > 0 and no top_k) the chunk's fixed-point weight sum. parts == 0: none (the sampling
  // kernel makes these passes itself).
  int32_t parts;
  float* part_v;               // [rows, parts]
  int32_t* part_i;             // [rows, parts]
  unsigned long long* part_w;  // [rows, parts]
  int32_t* out_token;          // [rows]
  float* out_logprob;          // [rows]
  int32_t* out_top_tok;        // [rows, kSampleMaxTopLogprobs]
  float* out_top_lp;           // [rows, kSampleMaxTopLogprobs]
};

// Queues the penalty pass (rows with ws_row >= 0) and the sampling kernel (one block per row) on `stream`.
cudaError_t launch_sample_rows(const SampleKernelParams& p, cudaStream_t stream);

}  // namespace dsaserve::kernels::cuda
