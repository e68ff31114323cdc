#pragma once
// Host wrappers of the sm_90a lightning indexer kernels: the index-key cache in kernel formats (bf16 or FP8
// e4m3 with a per-key scale) and the indexer fused with its exact top-k. They validate tensors (throwing
// dsaserve::Error), allocate workspaces and launch on `stream` (default: the legacy default stream);
// results are ready in stream order. `opts` picks the kernels (kernels/kernel_options.h; the defaults:
// automatic). Query rows (row_seq, row_len, page table) as for MLA decode (attention/attention_kernels.h).
#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "core/tensor.h"
#include "kernels/cuda/indexer/indexer_topk_params.h"
#include "kernels/ops.h"

namespace dsaserve::kernels::cuda {

// An empty index-key cache of num_slots slots on the GPU: bf16 [slots, 128] or the FP8 format u8
// [slots, 132] (codes [slots, 128] e4m3, then scales [slots] f32: indexer_topk_params.h).
Tensor indexer_key_cache_empty(int64_t num_slots, IndexerKeyFormat format);
// The format of an index-key cache tensor (bf16 [*, 128] or u8 [*, 132]); throws for anything else.
IndexerKeyFormat indexer_key_format(const Tensor& cache);
// The FP8 index-key store: cache[slots[i]] = quantised src[i]. cache u8 [num_slots, 132] (FP8 format),
// src f32 [n, 128] (last dim contiguous, any row stride), slots i32 [n] (outside [0, num_slots): skipped),
// all on the GPU. Per key: scale = amax / 448 (1 when not positive), codes e4m3_satfinite(k / scale);
// bit-identical to kernels/cpu/indexer_key_fp8.h. A fused kernel can call indexer_key_store_fp8_warp
// (sm90_indexer_fp8.cuh) instead.
void indexer_key_cache_store(Tensor& cache, const Tensor& slots, const Tensor& src,
                             cudaStream_t stream = nullptr);
// The first n positions of one request's index keys as f32 [n, 128] (FP8: codes times the key's scale);
// page_table i32 [>= ceil(n / page_size)] on the GPU (its page ids must be valid: not checked here).
Tensor indexer_key_cache_gather(const Tensor& cache, const Tensor& page_table, int64_t page_size, int64_t n,
                                cudaStream_t stream = nullptr);

// The launch plan of indexer_topk_rows for R rows of at most max_len keys (row_len_host: their lengths,
// or empty): packed or dense scores, the blocks of rows within score_budget_bytes, and each block's
// select splits and workspace sizes. Throws when a host length is outside [0, max_len].
IndexerRowsPlan plan_indexer_topk(int64_t rows, int64_t max_len, int64_t topk,
                                  std::span<const int32_t> row_len_host = {},
                                  int64_t score_budget_bytes = kIndexerScoreBudgetBytes);

// Lightning indexer + top-k for R query rows: q f32 [R, ih, 128] (ih 32 or 64), w f32 [R, ih], cache
// bf16 [slots, 128] or FP8 u8 [slots, 132], page table / row_seq / row_len / max_len as for mla_decode.
// -> i32 [R, min(topk, max_len)]: ascending positions, or 0..n-1 padded with -1 when n <= topk.
// row_len_host: the same lengths on the host, or empty. Workspace: the f32 scores of the rows with more
// than topk keys packed (given row_len_host; the offsets are computed on the device), else dense [R,
// max_len]; plus indexer_workspace_words(R, splits) u32 (8 KB a row). When the scores exceed
// score_budget_bytes the rows run in consecutive blocks (one launch each, shapes from the host's lengths
// only: capturable) whose scores stay within it (a row is never split); the output is the same.
// plan: from plan_indexer_topk for this call's shape (checked; row_len_host and score_budget_bytes are then
// the plan's), or null: planned here from row_len_host and score_budget_bytes.
Tensor indexer_topk_rows(const Tensor& q, const Tensor& w, const Tensor& cache, const Tensor& page_table,
                         int64_t page_size, const Tensor& row_seq, const Tensor& row_len, int64_t max_len,
                         int64_t topk, double scale, double weight_scale, cudaStream_t stream = nullptr,
                         std::span<const int32_t> row_len_host = {},
                         int64_t score_budget_bytes = kIndexerScoreBudgetBytes,
                         const KernelOptions& opts = {}, const IndexerRowsPlan* plan = nullptr);

// The ops.h contract of indexer_topk for one request (keys.cache bf16 [slots, 128] or FP8 u8 [slots, 132]);
// like mla_attention_absorbed_sm90 it uploads its rows and plans the call (the model's steps do not).
Tensor indexer_topk_sm90(const Tensor& q, const Tensor& w, const PagedSeq& keys, int64_t start_pos,
                         int64_t topk, double scale, double weight_scale, const KernelOptions& opts = {});

}  // namespace dsaserve::kernels::cuda
