#include "kernels/cuda/indexer/indexer_kernels.h"

#include <algorithm>
#include <vector>

#include "kernels/cuda/common/check.h"
#include "kernels/cuda/common/query_rows.h"
#include "kernels/cuda/common/views.h"
#include "kernels/cuda/cuda_ops.h"

namespace dsaserve::kernels::cuda {

Tensor indexer_key_cache_empty(int64_t num_slots, IndexerKeyFormat format) {
  DSA_CHECK(num_slots > 0, "indexer key cache: {} slots", num_slots);
  return format == IndexerKeyFormat::bf16
             ? Tensor::empty({num_slots, kIndexerDim}, DType::bf16, Device::cuda)
             : Tensor::empty({num_slots, kIndexerFp8RowBytes}, DType::u8, Device::cuda);
}

IndexerKeyFormat indexer_key_format(const Tensor& cache) {
  DSA_CHECK(cache.defined() && cache.device() == Device::cuda && cache.dim() == 2 && cache.is_contiguous(),
            "indexer key cache: expected a contiguous 2-D CUDA tensor, got {}",
            cache.defined() ? cache.describe() : std::string("nothing"));
  if (cache.dtype() == DType::bf16 && cache.size(1) == kIndexerDim) return IndexerKeyFormat::bf16;
  DSA_CHECK(cache.dtype() == DType::u8 && cache.size(1) == kIndexerFp8RowBytes,
            "indexer key cache {}: expected bf16 [slots, {}] or FP8 u8 [slots, {}]", cache.describe(),
            kIndexerDim, kIndexerFp8RowBytes);
  return IndexerKeyFormat::fp8_e4m3;
}

void indexer_key_cache_store(Tensor& cache, const Tensor& slots, const Tensor& src, cudaStream_t stream) {
  DSA_CHECK(indexer_key_format(cache) == IndexerKeyFormat::fp8_e4m3,
            "indexer_key_cache_store: expected an FP8 index-key cache u8 [slots, {}], got {}",
            kIndexerFp8RowBytes, cache.describe());
  check_gpu(src, DType::f32, 2, "indexer key store source");
  check_gpu(slots, DType::i32, 1, "indexer key store slots");
  DSA_CHECK(src.size(1) == kIndexerDim && slots.size(0) == src.size(0),
            "indexer_key_cache_store: source {} should be [n, {}] with one slot each, slots {}",
            src.describe(), kIndexerDim, slots.describe());
  IndexerKeyStoreParams p{src.data<float>(), slots.data<int32_t>(), cache.raw_data(),
                          src.size(0),       src.stride(0),         cache.size(0)};
  DSA_CUDA_CHECK(launch_indexer_key_store(p, stream));
}

Tensor indexer_key_cache_gather(const Tensor& cache, const Tensor& page_table, int64_t page_size, int64_t n,
                                cudaStream_t stream) {
  const IndexerKeyFormat f = indexer_key_format(cache);
  check_gpu(page_table, DType::i32, 1, "indexer key gather page table");
  DSA_CHECK(page_size > 0 && n >= 0 && n <= page_table.size(0) * page_size,
            "indexer key gather: {} positions with {} pages of {}", n, page_table.size(0), page_size);
  Tensor out = Tensor::empty({n, kIndexerDim}, DType::f32, Device::cuda);
  IndexerKeyGatherParams p{
      cache.raw_data(), page_table.data<int32_t>(), out.data<float>(), n, page_size, cache.size(0), f};
  DSA_CUDA_CHECK(launch_indexer_key_gather(p, stream));
  return out;
}

IndexerRowsPlan plan_indexer_topk(int64_t R, int64_t max_len, int64_t topk,
                                  std::span<const int32_t> row_len_host, int64_t score_budget_bytes) {
  DSA_CHECK(R >= 0 && max_len >= 0 && topk > 0, "indexer plan: {} rows, max length {}, topk {}", R, max_len,
            topk);
  IndexerRowsPlan pl;
  pl.planned = true;
  pl.rows = R;
  pl.max_len = max_len;
  pl.topk = topk;
  if (R == 0 || std::min(topk, max_len) == 0) return pl;  // nothing to launch
  // Scores: packed (only the rows with more than topk keys, offsets computed on the device) when the host
  // knows the row lengths, else dense [R, max_len] (one row: the same, without the offsets launch).
  pl.packed = R > 1 && int64_t(row_len_host.size()) == R && max_len > topk;  // one row: dense is packed
  if (pl.packed) {
    for (int32_t n : row_len_host)
      DSA_CHECK(n >= 0 && n <= max_len, "indexer: row length {} outside [0, {}]", n, max_len);
  }
  const int64_t score_stride = std::max<int64_t>(4, (max_len + 3) / 4 * 4);
  // Floats row r scores (packed: its own keys when more than topk, dense: the stride).
  auto row_elems = [&](int64_t r) -> int64_t {
    if (max_len <= topk) return 0;  // no row is scored
    if (!pl.packed) return score_stride;
    const int64_t n = row_len_host[size_t(r)];
    return n > topk ? (n + 3) / 4 * 4 : 0;
  };
  // Rows [r0, r1) in one launch, their score buffer within the budget (a row is never split).
  auto block = [&](int64_t r0, int64_t r1, int64_t score_elems) {
    IndexerRowsPlan::Block b;
    b.r0 = r0;
    b.r1 = r1;
    b.score_floats = std::max<int64_t>(4, score_elems);
    b.splits = indexer_select_splits(r1 - r0, max_len, indexer_num_sms(), &b.split_len);
    b.work_words = indexer_workspace_words(r1 - r0, b.splits);
    pl.blocks.push_back(b);
  };
  const int64_t budget = std::max<int64_t>(score_budget_bytes / 4, 4);
  int64_t r0 = 0, elems = 0;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t e = row_elems(r);
    if (r > r0 && elems + e > budget) {
      block(r0, r, elems);
      r0 = r;
      elems = 0;
    }
    elems += e;
  }
  block(r0, R, elems);
  return pl;
}

Tensor indexer_topk_rows(const Tensor& q, const Tensor& w, const Tensor& cache, const Tensor& page_table,
                         int64_t page_size, const Tensor& row_seq, const Tensor& row_len, int64_t max_len,
                         int64_t topk, double scale, double weight_scale, cudaStream_t stream,
                         std::span<const int32_t> row_len_host, int64_t score_budget_bytes,
                         const KernelOptions& opts, const IndexerRowsPlan* given) {
  check_gpu(q, DType::f32, 3, "indexer q");
  check_gpu(w, DType::f32, 2, "indexer weights");
  const IndexerKeyFormat format = indexer_key_format(cache);
  const int64_t R = q.size(0), ih = q.size(1);
  DSA_CHECK(q.size(2) == kIndexerDim && (ih == 32 || ih == 64), "indexer: q {} should be [R, 32 or 64, {}]",
            q.describe(), kIndexerDim);
  DSA_CHECK(w.size(0) == R && w.size(1) == ih, "indexer: weights {} should be [{}, {}]", w.describe(), R, ih);
  DSA_CHECK(topk > 0, "indexer: topk {} must be positive", topk);
  const RowDesc d = check_rows(page_table, page_size, row_seq, row_len, R, max_len, "indexer");
  const int64_t out_k = std::min(topk, max_len);
  Tensor out = Tensor::empty({R, out_k}, DType::i32, Device::cuda);
  if (R == 0 || out_k == 0) return out;
  const IndexerRowsPlan plan = given != nullptr && given->planned
                                   ? *given
                                   : plan_indexer_topk(R, max_len, topk, row_len_host, score_budget_bytes);
  DSA_CHECK(plan.rows == R && plan.max_len == max_len && plan.topk == topk,
            "indexer: a plan for {} rows of {} keys (top-{}), the call has {} of {} (top-{})", plan.rows,
            plan.max_len, plan.topk, R, max_len, topk);
  const int64_t score_stride = std::max<int64_t>(4, (max_len + 3) / 4 * 4);
  for (const IndexerRowsPlan::Block& b : plan.blocks) {
    const int64_t r0 = b.r0, rows = b.r1 - b.r0;
    Tensor scores = Tensor::empty({b.score_floats}, DType::f32, Device::cuda);
    Tensor offsets = plan.packed ? Tensor::empty({rows}, DType::i64, Device::cuda) : Tensor();
    Tensor work = Tensor::empty({b.work_words}, DType::i32, Device::cuda);
    uint32_t* words = reinterpret_cast<uint32_t*>(work.data<int32_t>());
    IndexerTopkParams p{};
    p.q = q.data<float>() + r0 * q.stride(0);
    p.w = w.data<float>() + r0 * w.stride(0);
    p.cache = cache.raw_data();
    // Without row_seq row r reads page-table row r: the block's rows start at r0 there too.
    p.page_table = page_table.data<int32_t>() + (d.row_seq == nullptr ? r0 * d.pt_stride : 0);
    p.row_seq = d.row_seq == nullptr ? nullptr : d.row_seq + r0;
    p.row_len = row_len.data<int32_t>() + r0;
    p.scores = scores.data<float>();
    p.score_offsets = plan.packed ? offsets.data<int64_t>() : nullptr;
    p.out = out.data<int32_t>() + r0 * out_k;
    p.rows = rows;
    p.heads = ih;
    p.q_s0 = q.stride(0);
    p.q_s1 = q.stride(1);
    p.w_s0 = w.stride(0);
    p.num_seqs = d.row_seq == nullptr ? d.num_seqs - r0 : d.num_seqs;
    p.pt_cols = d.pt_cols;
    p.pt_stride = d.pt_stride;
    p.page_size = page_size;
    p.num_slots = cache.size(0);
    p.score_stride = score_stride;
    p.out_stride = out_k;
    p.out_k = out_k;
    p.topk = topk;
    p.max_len = max_len;
    p.splits = b.splits;
    p.split_len = b.split_len;
    indexer_workspace_pointers(p, words);
    p.scale = float(scale);
    p.weight_scale = float(weight_scale);
    p.key_format = format;
    p.select_path = opts.indexer_select;
    p.score_kernel = opts.indexer_score;
    p.pdl = opts.pdl;
    DSA_CUDA_CHECK(launch_indexer_topk_fused(p, stream));
  }
  return out;
}

Tensor indexer_topk_sm90(const Tensor& q, const Tensor& w, const PagedSeq& keys, int64_t start_pos,
                         int64_t topk, double scale, double weight_scale, const KernelOptions& opts) {
  const int64_t T = q.size(0);
  DSA_CHECK(start_pos >= 0, "indexer: start position {}", start_pos);
  check_gpu(keys.page_table, DType::i32, 1, "indexer page table");
  std::vector<int32_t> len(static_cast<size_t>(T)), seq(static_cast<size_t>(T), 0);
  for (int64_t t = 0; t < T; ++t) len[size_t(t)] = int32_t(start_pos + t + 1);
  const Tensor pt = keys.page_table.view({1, keys.page_table.size(0)});
  return indexer_topk_rows(q, w, keys.cache, pt, keys.page_size, gpu_i32(seq), gpu_i32(len), start_pos + T,
                           topk, scale, weight_scale, op_stream(), len, kIndexerScoreBudgetBytes, opts);
}

}  // namespace dsaserve::kernels::cuda
