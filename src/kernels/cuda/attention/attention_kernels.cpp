#include "kernels/cuda/attention/attention_kernels.h"

#include <algorithm>
#include <vector>

#include "kernels/cuda/common/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_cache.h"
#include "kernels/cuda/indexer/indexer_topk_params.h"
#include "kernels/cuda/views.h"

namespace dsaserve::kernels::cuda {

namespace {

int sm_count() { return device_sm_count(); }

void check_gpu(const Tensor& t, DType dt, int64_t dims, const char* what) {
  DSA_CHECK(t.defined() && t.device() == Device::cuda && t.dtype() == dt && t.dim() == dims,
            "{}: expected a {}-D {} CUDA tensor, got {}", what, dims, dtype_name(dt),
            t.defined() ? t.describe() : std::string("nothing"));
  DSA_CHECK(t.numel() == 0 || t.stride(dims - 1) == 1 || t.size(dims - 1) <= 1,
            "{}: the last dimension must be contiguous, got {}", what, t.describe());
}

// Shared validation of the row description (page table, row_seq, row_len).
struct RowDesc {
  const int32_t* row_seq = nullptr;
  int64_t num_seqs = 0, pt_cols = 0, pt_stride = 0;
};

RowDesc check_rows(const Tensor& page_table, int64_t page_size, const Tensor& row_seq, const Tensor& row_len,
                   int64_t rows, int64_t max_len, const char* what) {
  check_gpu(page_table, DType::i32, 2, what);
  check_gpu(row_len, DType::i32, 1, what);
  DSA_CHECK(row_len.size(0) == rows, "{}: row_len {} should have {} rows", what, row_len.describe(), rows);
  DSA_CHECK(page_size > 0 && max_len >= 0, "{}: page size {} and max length {} must be positive", what,
            page_size, max_len);
  DSA_CHECK(max_len <= page_table.size(1) * page_size,
            "{}: {} positions need {} pages, the page table has {} per sequence", what, max_len,
            (max_len + page_size - 1) / page_size, page_table.size(1));
  RowDesc d;
  if (row_seq.defined()) {
    check_gpu(row_seq, DType::i32, 1, what);
    DSA_CHECK(row_seq.size(0) == rows, "{}: row_seq {} should have {} rows", what, row_seq.describe(), rows);
    d.row_seq = row_seq.data<int32_t>();
  } else {
    DSA_CHECK(page_table.size(0) >= rows, "{}: {} rows but {} page-table rows", what, rows,
              page_table.size(0));
  }
  d.num_seqs = page_table.size(0);
  d.pt_cols = page_table.size(1);
  d.pt_stride = page_table.stride(0);
  return d;
}

// i32 [n] on the GPU from host values.
Tensor gpu_i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t.to(Device::cuda);
}

}  // namespace

Tensor mla_kv_cache_empty(int64_t num_slots, MlaKvFormat format) {
  DSA_CHECK(num_slots > 0, "mla cache: {} slots", num_slots);
  return format == MlaKvFormat::bf16 ? Tensor::empty({num_slots, kMlaDim}, DType::bf16, Device::cuda)
                                     : Tensor::empty({num_slots, kMlaFp8RowBytes}, DType::u8, Device::cuda);
}

MlaKvFormat mla_kv_format(const Tensor& cache) {
  DSA_CHECK(cache.defined() && cache.device() == Device::cuda && cache.dim() == 2 && cache.is_contiguous(),
            "mla cache: expected a contiguous 2-D CUDA tensor, got {}",
            cache.defined() ? cache.describe() : std::string("nothing"));
  if (cache.dtype() == DType::bf16 && cache.size(1) == kMlaDim) return MlaKvFormat::bf16;
  if (cache.dtype() == DType::u8 && cache.size(1) == kMlaFp8RowBytes) return MlaKvFormat::fp8_e4m3;
  fail("mla cache: expected bf16 [slots, {}] or u8 [slots, {}] (fp8), got {}", kMlaDim, kMlaFp8RowBytes,
       cache.describe());
}

void mla_kv_cache_store(Tensor& cache, const Tensor& slots, const Tensor& src, cudaStream_t stream) {
  const MlaKvFormat f = mla_kv_format(cache);
  check_gpu(src, DType::f32, 2, "mla cache store source");
  check_gpu(slots, DType::i32, 1, "mla cache store slots");
  DSA_CHECK(src.size(1) == kMlaDim && slots.size(0) == src.size(0),
            "mla cache store: source {} should be [{}, {}] for slots {}", src.describe(), slots.size(0),
            kMlaDim, slots.describe());
  MlaCacheStoreParams p{};
  p.src = src.data<float>();
  p.slots = slots.data<int32_t>();
  p.cache = cache.raw_data();
  p.n = src.size(0);
  p.src_stride = src.stride(0);
  p.num_slots = cache.size(0);
  p.format = f;
  DSA_CUDA_CHECK(launch_mla_cache_store(p, stream));
}

Tensor mla_kv_cache_gather(const Tensor& cache, const Tensor& page_table, int64_t page_size, int64_t n,
                           cudaStream_t stream) {
  const MlaKvFormat f = mla_kv_format(cache);
  check_gpu(page_table, DType::i32, 1, "mla cache gather page table");
  DSA_CHECK(n >= 0, "mla cache gather: {} positions", n);
  check_pages(PagedSeq{cache, page_table, page_size}, n, cache.size(0), "mla cache gather");
  Tensor out = Tensor::empty({n, kMlaDim}, DType::f32, Device::cuda);
  MlaCacheGatherParams p{};
  p.cache = cache.raw_data();
  p.page_table = page_table.data<int32_t>();
  p.out = out.data<float>();
  p.n = n;
  p.page_size = page_size;
  p.num_slots = cache.size(0);
  p.format = f;
  DSA_CUDA_CHECK(launch_mla_cache_gather(p, stream));
  return out;
}

MlaRowsPlan plan_mla_decode(int64_t rows, int64_t heads, int64_t max_keys, const KernelOptions& opts) {
  DSA_CHECK(rows >= 0 && heads >= 0 && max_keys >= 0, "mla decode plan: {} rows, {} heads, {} keys", rows,
            heads, max_keys);
  MlaRowsPlan pl;
  pl.planned = true;
  pl.rows = rows;
  pl.heads = heads;
  pl.max_keys = max_keys;
  pl.splits =
      rows == 0 || heads == 0 ? 1 : mla_decode_splits(rows, heads, max_keys, sm_count(), opts.mla_decode);
  if (pl.splits > 1) {
    pl.partial_out_floats = rows * pl.splits * heads * kMlaLatent;
    pl.partial_lse_floats = rows * pl.splits * heads;
  }
  return pl;
}

Tensor mla_decode(const Tensor& q_lat, const Tensor& q_rope, const Tensor& cache, const Tensor& page_table,
                  int64_t page_size, const Tensor& row_seq, const Tensor& row_len, int64_t max_len,
                  const Tensor& sel, double scale, cudaStream_t stream, const KernelOptions& opts,
                  const MlaRowsPlan* given) {
  const MlaKvFormat f = mla_kv_format(cache);
  check_gpu(q_lat, DType::f32, 3, "mla decode q_lat");
  check_gpu(q_rope, DType::f32, 3, "mla decode q_rope");
  const int64_t R = q_lat.size(0), nh = q_lat.size(1);
  DSA_CHECK(q_lat.size(2) == kMlaLatent && q_rope.size(0) == R && q_rope.size(1) == nh &&
                q_rope.size(2) == kMlaRope,
            "mla decode: q_lat {} / q_rope {} should be [R, heads, {}] / [R, heads, {}]", q_lat.describe(),
            q_rope.describe(), kMlaLatent, kMlaRope);
  const RowDesc d = check_rows(page_table, page_size, row_seq, row_len, R, max_len, "mla decode");
  MlaDecodeParams p{};
  if (sel.defined()) {
    check_gpu(sel, DType::i32, 2, "mla decode selection");
    DSA_CHECK(sel.size(0) == R, "mla decode: selection {} should have {} rows", sel.describe(), R);
    p.sel = sel.data<int32_t>();
    p.sel_k = sel.size(1);
    p.sel_stride = sel.stride(0);
  }
  Tensor out = Tensor::empty({R, nh, kMlaLatent}, DType::f32, Device::cuda);
  if (R == 0 || nh == 0) return out;
  p.q_lat = q_lat.data<float>();
  p.q_rope = q_rope.data<float>();
  p.cache = cache.raw_data();
  p.page_table = page_table.data<int32_t>();
  p.row_seq = d.row_seq;
  p.row_len = row_len.data<int32_t>();
  p.out = out.data<float>();
  p.rows = R;
  p.heads = nh;
  p.ql_s0 = q_lat.stride(0);
  p.ql_s1 = q_lat.stride(1);
  p.qr_s0 = q_rope.stride(0);
  p.qr_s1 = q_rope.stride(1);
  p.num_seqs = d.num_seqs;
  p.pt_cols = d.pt_cols;
  p.pt_stride = d.pt_stride;
  p.page_size = page_size;
  p.num_slots = cache.size(0);
  p.max_keys = sel.defined() ? p.sel_k : max_len;
  p.kernel = opts.mla_decode;
  p.v5_order = opts.mla_v5_order;
  const MlaRowsPlan plan =
      given != nullptr && given->planned ? *given : plan_mla_decode(R, nh, p.max_keys, opts);
  DSA_CHECK(plan.rows == R && plan.heads == nh && plan.max_keys == p.max_keys,
            "mla decode: a plan for {} rows x {} heads x {} keys, the call has {} x {} x {}", plan.rows,
            plan.heads, plan.max_keys, R, nh, p.max_keys);
  p.splits = plan.splits;
  p.scale = float(scale);
  p.format = f;
  Tensor part_out, part_lse;
  if (p.splits > 1) {
    part_out = Tensor::empty({plan.partial_out_floats}, DType::f32, Device::cuda);
    part_lse = Tensor::empty({plan.partial_lse_floats}, DType::f32, Device::cuda);
    p.partial_out = part_out.data<float>();
    p.partial_lse = part_lse.data<float>();
  }
  DSA_CUDA_CHECK(launch_mla_decode(p, stream));
  return out;
}

Tensor mla_attention_absorbed_sm90(const Tensor& q_lat, const Tensor& q_rope, const PagedSeq& kv,
                                   int64_t start_pos, const Tensor& sel, double scale,
                                   const KernelOptions& opts) {
  const int64_t T = q_lat.size(0);
  DSA_CHECK(start_pos >= 0, "mla: start position {}", start_pos);
  check_gpu(kv.page_table, DType::i32, 1, "mla page table");
  std::vector<int32_t> len(static_cast<size_t>(T)), seq(static_cast<size_t>(T), 0);
  for (int64_t t = 0; t < T; ++t) len[size_t(t)] = int32_t(start_pos + t + 1);
  const Tensor pt = kv.page_table.view({1, kv.page_table.size(0)});
  return mla_decode(q_lat, q_rope, kv.cache, pt, kv.page_size, gpu_i32(seq), gpu_i32(len), start_pos + T, sel,
                    scale, op_stream(), opts);
}

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
