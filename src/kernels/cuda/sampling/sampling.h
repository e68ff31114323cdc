#pragma once
// GPU sampler: one token per row of a batch of logits [R, vocab] f32 on the device, with the CPU
// sampler's semantics (runtime/sampler/sampler.h): logit_bias (in list order), repetition penalty over
// the prompt + output tokens, presence / frequency penalties over the output tokens, then greedy (first
// maximum, temperature 0) or temperature -> softmax -> top_k -> top_p -> min_p -> a draw. The draw is the
// CPU's: the caller passes the request's uniform (SamplerState::uniform(), taken only when temperature
// > 0), and the kernel returns the first candidate, in the CPU's order (by id without top_k / top_p /
// min_p, else by logit with ties to the lower id), at which the cumulative probability exceeds it; so GPU
// and CPU agree except where a cumulative sum lies within rounding (~1e-12) of the draw. Probabilities are
// computed in fp64 and summed as 2^-44 fixed-point integers (exact and independent of thread order).
// Log-probabilities come from the raw row (log_softmax of the unprocessed logits). Rows with NaN logits,
// or no finite logit, are not supported. Host API (sampling.cu holds the kernels).
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace dsaserve::kernels::cuda {

// One row's request. The spans must stay valid during the call.
struct SampleRequest {
  float temperature = 1.0f;  // [0, 100]; 0: greedy
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // <= 0: no limit
  float min_p = 0.0f;        // [0, 1]
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;                             // > 0
  std::span<const std::pair<int32_t, float>> logit_bias;       // added in this order (a token may repeat)
  std::span<const int32_t> seen_tokens;                        // distinct prompt + output tokens
  std::span<const std::pair<int32_t, int32_t>> output_counts;  // distinct output tokens, counts > 0
  double uniform = 0.0;      // [0, 1): the request's draw for this step (ignored when temperature is 0)
  bool logprobs = false;     // the sampled token's log-probability
  int32_t top_logprobs = 0;  // [0, 20]: the most likely tokens of the raw row too
};

struct SampleTokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleOutput {
  int32_t token = 0;
  float logprob = 0.0f;                 // when logprobs or top_logprobs > 0
  std::vector<SampleTokenLogprob> top;  // top_logprobs entries, most likely first (ties: lower id)
};

// Samples one token per row of `logits` ([rows.size(), vocab] f32 on the CUDA device, last dimension
// contiguous, vocab < 2^20) on the operator stream and waits for the result. Throws dsaserve::Error naming
// the row and field when a request is out of range or a token id is outside the vocabulary.
std::vector<SampleOutput> sample_rows(const Tensor& logits, std::span<const SampleRequest> rows);

}  // namespace dsaserve::kernels::cuda
