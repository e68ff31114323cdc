#pragma once
// Host wrappers of the sm_90a MLA kernels: the latent cache in kernel formats (bf16 or FP8 e4m3 with
// per-128 scales), sparse/dense MLA decode in the absorbed form (the lightning indexer's wrappers, over
// the same query rows: indexer/indexer_kernels.h) and the dense MHA-form prefill attention. They validate
// tensors (throwing dsaserve::Error), allocate workspaces and launch on `stream` (default: the legacy default
// stream); results are ready in stream order. `opts` picks the kernels (kernels/kernel_options.h; the
// defaults: automatic).
//
// Query rows: a batch of R rows, each naming its page-table row (row_seq, or row r -> r) and its
// visible length row_len (positions 0..row_len-1 exist in the cache). A decode batch has one row per
// request; a prefill chunk of one request may pass one row per token with row_len = start_pos + t + 1.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/tensor.h"
#include "kernels/cuda/attention/mla_decode_params.h"
#include "kernels/ops.h"

namespace dsaserve::kernels::cuda {

// An empty latent cache of num_slots rows on the GPU: bf16 [slots, 576] or u8 [slots, 656] (fp8).
Tensor mla_kv_cache_empty(int64_t num_slots, MlaKvFormat format);
// The format of a latent cache tensor (bf16 [*, 576] or u8 [*, 656]); throws for anything else.
MlaKvFormat mla_kv_format(const Tensor& cache);
// cache[slots[i]] = src[i]: src f32 [n, 576] (last dim contiguous), slots i32 [n], all on the GPU.
void mla_kv_cache_store(Tensor& cache, const Tensor& slots, const Tensor& src, cudaStream_t stream = nullptr);
// The first n positions of one request's latent cache as f32 [n, 576] (fp8 rows dequantised): cache from
// mla_kv_cache_empty, page_table i32 [n_pages] on the GPU (its first ceil(n / page_size) pages are
// range-checked on the host).
Tensor mla_kv_cache_gather(const Tensor& cache, const Tensor& page_table, int64_t page_size, int64_t n,
                           cudaStream_t stream = nullptr);

// The launch plan of mla_decode for R rows x nh heads over at most max_keys keys a row (sel's k, or
// max_len): its key splits (mla_decode_splits of opts' kernel and the SM count) and workspace sizes.
MlaRowsPlan plan_mla_decode(int64_t rows, int64_t heads, int64_t max_keys, const KernelOptions& opts = {});

// Absorbed MLA attention for R query rows. q_lat f32 [R, nh, 512], q_rope f32 [R, nh, 64] (last dims
// contiguous); cache from mla_kv_cache_empty; page_table i32 [num_seqs, max_pages] (rows contiguous);
// row_seq i32 [R] or undefined; row_len i32 [R]; max_len >= every row_len (host bound); sel i32 [R, k]
// selected positions (-1 or invalid entries skipped) or undefined for all positions. -> f32 [R, nh, 512].
// plan: from plan_mla_decode for this call's shape (checked), or null: planned here.
Tensor mla_decode(const Tensor& q_lat, const Tensor& q_rope, const Tensor& cache, const Tensor& page_table,
                  int64_t page_size, const Tensor& row_seq, const Tensor& row_len, int64_t max_len,
                  const Tensor& sel, double scale, cudaStream_t stream = nullptr,
                  const KernelOptions& opts = {}, const MlaRowsPlan* plan = nullptr);

// The ops.h contract of mla_attention_absorbed for one request (rows t = 0..T-1 at start_pos + t) over a
// latent cache in a kernel format (kv.cache from mla_kv_cache_empty, kv.page_table i32 on the GPU). It
// uploads its rows' lengths (a synchronous copy) and plans the call: for direct callers of the one-request
// operator; the model's steps call mla_decode over the step plan's rows and launch plan instead.
Tensor mla_attention_absorbed_sm90(const Tensor& q_lat, const Tensor& q_rope, const PagedSeq& kv,
                                   int64_t start_pos, const Tensor& sel, double scale,
                                   const KernelOptions& opts = {});

// Dense causal MHA-form attention on tensor cores (sm90_mha_prefill.cu) over bf16 keys and values: q f32
// [T, nh, nope + R] (last dim contiguous), k_nope bf16 [S, nh, nope], k_rope bf16 [S, R], v bf16 [S, nh, dv]
// (last dims contiguous, every stride a multiple of 8 values); row t attends keys 0 .. start_pos + t.
// -> f32 [T, nh, dv]. Dims: mha_prefill_supported (attention/mha_prefill_params.h), else it throws.
// tile_rows: the query rows of a block, 64 or 128; 0: by the grid (mha_prefill_tile_rows).
Tensor mha_prefill(const Tensor& q, const Tensor& k_nope, const Tensor& k_rope, const Tensor& v,
                   int64_t start_pos, double scale, cudaStream_t stream = nullptr, int tile_rows = 0);
// A contiguous bf16 copy of an f32 CUDA tensor of 2 or 3 dims whose last dim is contiguous (any other
// strides): the MHA form's keys and values as mha_prefill reads them.
Tensor mha_bf16_copy(const Tensor& x, cudaStream_t stream = nullptr);

}  // namespace dsaserve::kernels::cuda
