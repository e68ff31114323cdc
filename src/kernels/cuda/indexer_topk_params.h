#pragma once
// Plain parameters of the lightning indexer + top-k kernels (sm90_indexer_topk.cu).
//
// For query row r (one decode token of a request, or one prefill token) with n = row_len[r] visible
// keys: score[s] = sum_h w[r,h] * weight_scale * relu(scale * q[r,h] . k[s]) for s < n, keys read
// from the paged indexer K cache (bf16 [slots, 128]). The output row holds the top `topk` positions
// (ties toward the lower position), ascending; rows with n <= topk list 0..n-1 and pad with -1.
//
// Two kernels: the score kernel (tensor cores: a tile of 128 keys times all heads per warp step) writes
// the f32 scores and, fused, a 2048-bin histogram of their top 11 order-preserving bits; the select
// kernel (one block per row) finds the exact k-th score by radix refinement of that histogram over the
// candidates of its bin, then writes the selection in position order with a block-wide scan.
#include <cuda_runtime.h>

#include <cstdint>

namespace dsaserve::kernels::cuda {

inline constexpr int kIndexerDim = 128;        // index_head_dim
inline constexpr int kIndexerHistBins = 2048;  // first radix digit: 11 bits

struct IndexerTopkParams {
  const float* q;             // [rows, heads, 128] f32, strides q_s0, q_s1 (elements), not null
  const float* w;             // [rows, heads] f32, row stride w_s0, not null
  const void* cache;          // [num_slots, 128] bf16 indexer K cache, not null
  const int32_t* page_table;  // [num_seqs, pt_stride] i32, not null
  const int32_t* row_seq;     // [rows] i32 sequence (page-table row) of each query row; null: r -> r
  const int32_t* row_len;     // [rows] i32 visible keys of each row, not null
  float* scores;   // [rows, score_stride] f32 workspace (score_stride >= max_len, a multiple of 4; 16-byte
                   // aligned), not null
  uint32_t* hist;  // [rows, 2048] u32 workspace, not null (zeroed by the launch)
  int32_t* out;    // [rows, out_stride] i32, out_k columns written, not null
  int64_t rows, heads;  // heads: 32 or 64
  int64_t q_s0, q_s1, w_s0;
  int64_t num_seqs, pt_cols, pt_stride;  // page table rows, pages per row, row stride
  int64_t page_size, num_slots;
  int64_t score_stride, out_stride, out_k;  // out_k = min(topk, max_len)
  int64_t topk;
  int64_t max_len;  // host bound on row_len (sizes the grid)
  float scale, weight_scale;
  bool scores_only;  // benchmarks: run only the score kernel (the selection is not written)
};

// Zeroes the histogram, then runs the score and select kernels on `stream`.
cudaError_t launch_indexer_topk_fused(const IndexerTopkParams& p, cudaStream_t stream);

}  // namespace dsaserve::kernels::cuda
