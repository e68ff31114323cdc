#pragma once
// Plain parameters of the attention and indexer kernels (attention.cu, indexer.cu): straightforward
// correct versions (one block per (token, head), online softmax across warps); the fast ones come later.
#include <cuda_runtime.h>

#include <cstdint>

namespace dsaserve::kernels::cuda {

// Keys of query row t: sel[t][0..sel_k) skipping -1 (and anything outside 0..start_pos+t), or every
// position 0..start_pos+t when sel is null.
struct KeySelection {
  const int32_t* sel;  // [tokens, sel_k] stride sel_stride, or null
  int64_t sel_k, sel_stride;
  int64_t start_pos;
};

// Absorbed MLA: out[t,h] = softmax_s(scale * (q_lat[t,h] . kv[s][:L] + q_rope[t,h] . kv[s][L:])) kv[s][:L].
struct MlaParams {
  const float* q_lat;         // [tokens, heads, L] strides ql_s0, ql_s1
  const float* q_rope;        // [tokens, heads, R] strides qr_s0, qr_s1
  const float* cache;         // [slots, L + R] stride cache_stride (paged)
  const int32_t* page_table;  // [pages of the request]
  float* out;                 // [tokens, heads, L] contiguous
  int64_t tokens, heads, L, R, ql_s0, ql_s1, qr_s0, qr_s1, cache_stride, page_size, num_slots;
  KeySelection keys;
  float scale;
};
cudaError_t launch_mla_absorbed(const MlaParams& p, cudaStream_t stream);

// MHA: keys [k_nope[s,h] | k_rope[s]], values v[s,h].
struct MhaParams {
  const float* q;       // [tokens, heads, nope + R] strides q_s0, q_s1
  const float* k_nope;  // [S, heads, nope] strides kn_s0, kn_s1
  const float* k_rope;  // [S, R] stride kr_s0
  const float* v;       // [S, heads, dv] strides v_s0, v_s1
  float* out;           // [tokens, heads, dv] contiguous
  int64_t tokens, heads, nope, R, dv, S, q_s0, q_s1, kn_s0, kn_s1, kr_s0, v_s0, v_s1;
  KeySelection keys;
  float scale;
};
cudaError_t launch_mha(const MhaParams& p, cudaStream_t stream);

// Indexer scores: score[t][s] = sum_h w[t,h] * weight_scale * relu(scale * q[t,h] . k[s]) for
// s <= start_pos + t (others are not written).
struct IndexerScoreParams {
  const float* q;      // [tokens, ih, id] strides q_s0, q_s1
  const float* w;      // [tokens, ih] stride w_s0
  const float* cache;  // [slots, id] stride cache_stride (paged)
  const int32_t* page_table;
  float* score;  // [tokens, S] contiguous, S = start_pos + tokens
  int64_t tokens, ih, id, q_s0, q_s1, w_s0, cache_stride, page_size, num_slots, start_pos;
  float scale, weight_scale;
};
cudaError_t launch_indexer_scores(const IndexerScoreParams& p, cudaStream_t stream);

// Row t: the top-k of score[t][0..start_pos+t] (ties: lower position), ascending; rows with at most k
// visible keys list them all; padding -1.
struct TopkParams {
  const float* score;  // [tokens, S]
  int32_t* out;        // [tokens, out_k], out_k = min(k, S)
  int64_t tokens, S, k, out_k, start_pos;
};
cudaError_t launch_indexer_topk(const TopkParams& p, cudaStream_t stream);

}  // namespace dsaserve::kernels::cuda
