#include "runtime/engine/cuda_graph_plan.h"

#include <algorithm>

#include "core/error.h"

namespace dsaserve::runtime {

std::vector<int64_t> batch_buckets(int64_t max_bs) {
  std::vector<int64_t> out;
  for (int64_t b = 1; b < max_bs; b *= 2) out.push_back(b);
  if (max_bs > 0) out.push_back(max_bs);
  return out;
}

int64_t batch_bucket(int64_t b, std::span<const int64_t> buckets) {
  for (int64_t s : buckets) {
    if (s >= b) return s;
  }
  return 0;
}

int64_t context_bucket(int64_t max_len, int64_t index_topk, int64_t page_size) {
  DSA_CHECK(max_len >= 1 && page_size >= 1, "context_bucket: length {} and page size {} must be positive",
            max_len, page_size);
  if (index_topk > 0 && max_len <= index_topk) return index_topk;
  int64_t c = 1;
  while (c < max_len || c < page_size) c *= 2;
  return c;
}

GraphPlan::GraphPlan(const GraphPlanConfig& cfg) : cfg_(cfg), buckets_(batch_buckets(cfg.max_bs)) {}

std::optional<GraphKey> decode_graph_key(const model::ForwardBatch& b, const GraphPlan& plan) {
  const GraphPlanConfig& cfg = plan.config();
  const int64_t R = b.num_requests();
  if (cfg.max_bs <= 0 || R == 0 || R > cfg.max_bs || b.num_tokens() != R || !b.all_decoding())
    return std::nullopt;
  int64_t max_len = 0;
  for (int64_t r = 0; r < R; ++r) max_len = std::max(max_len, b.start_pos[size_t(r)] + 1);
  const GraphKey k{batch_bucket(R, plan.buckets()), context_bucket(max_len, cfg.index_topk, cfg.page_size)};
  if (k.bs * k.ctx > cfg.max_ctx_cells) return std::nullopt;
  return k;
}

DecodeInputLayout decode_input_layout(const GraphKey& k, int64_t page_size) {
  return DecodeInputLayout{k.bs, pages_for_ctx(k.ctx, page_size)};
}

void pack_decode_inputs(const model::ForwardBatch& b, const GraphKey& k, int32_t scratch_page,
                        std::span<int32_t> out) {
  const DecodeInputLayout L = decode_input_layout(k, b.page_size);
  const int64_t R = b.num_requests();
  DSA_CHECK(int64_t(out.size()) >= L.size(), "pack_decode_inputs: buffer of {} values, the layout needs {}",
            out.size(), L.size());
  DSA_CHECK(R <= k.bs && b.num_tokens() == R, "pack_decode_inputs: {} requests / {} tokens for a graph of {}",
            R, b.num_tokens(), k.bs);
  DSA_CHECK(scratch_page >= 0, "pack_decode_inputs: no scratch page");
  for (int64_t r = 0; r < k.bs; ++r) {
    int32_t* pt = out.data() + L.page_table() + r * L.pages;
    const size_t i = size_t(r);
    out[size_t(L.row_seq()) + i] = int32_t(r);
    if (r < R) {
      const int64_t len = b.start_pos[i] + 1;
      const auto pages = b.pages(r);
      const int64_t used = pages_for_ctx(len, b.page_size);
      DSA_CHECK(len <= k.ctx && used <= int64_t(pages.size()),
                "pack_decode_inputs: request {} of {} tokens ({} pages) does not fit the graph's context {}",
                r, len, pages.size(), k.ctx);
      out[size_t(L.ids()) + i] = b.input_ids[i];
      out[size_t(L.positions()) + i] = b.positions[i];
      out[size_t(L.slots()) + i] = b.out_cache_loc[i];
      out[size_t(L.row_len()) + i] = int32_t(len);
      std::copy(pages.begin(), pages.begin() + used, pt);
      std::fill(pt + used, pt + L.pages, pages[size_t(used - 1)]);
    } else {
      out[size_t(L.ids()) + i] = 0;
      out[size_t(L.positions()) + i] = 0;
      out[size_t(L.slots()) + i] = int32_t(int64_t(scratch_page) * b.page_size);
      out[size_t(L.row_len()) + i] = 1;
      std::fill(pt, pt + L.pages, scratch_page);
    }
  }
}

model::ForwardBatch padding_batch(const GraphKey& k, int32_t scratch_page, int64_t page_size) {
  model::ForwardBatch b;
  b.page_size = page_size;
  const int32_t token = 0, page = scratch_page;
  for (int64_t r = 0; r < k.bs; ++r)
    b.add_request(std::span<const int32_t>(&token, 1), 0, std::span<const int32_t>(&page, 1), true);
  return b;
}

}  // namespace dsaserve::runtime
