#include "runtime/engine/cuda_graph_plan.h"

#include <algorithm>
#include <vector>

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

const char* graph_pass_name(GraphPass p) {
  switch (p) {
    case GraphPass::decode: return "decode";
    case GraphPass::verify: return "verify";
    case GraphPass::draft: return "draft";
  }
  return "?";
}

GraphPlan::GraphPlan(const GraphPlanConfig& cfg) : cfg_(cfg), buckets_(batch_buckets(cfg.max_bs)) {}

int64_t cuda_graph_max_batch(const GraphSupport& s) {
  // Every request's rows must take the absorbed form (the MHA form sizes its work from the host-side
  // context), and a padding request's rows must fit the scratch page (checked at the runner's page size).
  const bool absorbed = s.attention == model::AttentionForm::absorbed ||
                        (s.attention == model::AttentionForm::automatic && s.mha_min_tokens > s.tokens);
  if (s.max_bs <= 0 || !s.built || s.device != Device::cuda || !s.kernel_format_cache || !absorbed ||
      s.tokens < 1)
    return 0;
  return s.max_running_requests > 0 ? std::min(s.max_bs, s.max_running_requests) : s.max_bs;
}

GraphSupport graph_support(const model::Model& m, std::optional<model::KvCacheDtype> kv_dtype,
                           const model::ForwardOptions& forward, int64_t max_bs, int64_t max_running_requests,
                           bool built) {
  GraphSupport s;
  s.max_bs = max_bs;
  s.max_running_requests = max_running_requests;
  s.built = built;
  s.device = m.weights().embed_tokens.device();
  const model::KvCacheDtype dt = kv_dtype.value_or(m.kv_dtype().value_or(
      s.device == Device::cuda ? model::kDefaultCudaKvDtype : model::KvCacheDtype::f32));
  s.kernel_format_cache = s.device == Device::cuda && dt != model::KvCacheDtype::f32;
  s.attention = forward.attention;
  s.mha_min_tokens = forward.mha_min_tokens;
  return s;
}

namespace {
// The one rule: at most max_bs requests of `tokens` rows each, whose logits are those rows, within the
// cells (a decode step: tokens 1 and the decode kind, checked by the caller).
std::optional<GraphKey> graph_key(int64_t R, int64_t tokens, int64_t max_len, bool gathers_logits,
                                  const GraphPlan& plan) {
  const GraphPlanConfig& cfg = plan.config();
  if (cfg.max_bs <= 0 || R == 0 || R > cfg.max_bs || gathers_logits || tokens < 1 || tokens > cfg.page_size)
    return std::nullopt;
  const GraphKey k{batch_bucket(R, plan.buckets()), context_bucket(max_len, cfg.index_topk, cfg.page_size),
                   tokens};
  if (k.bs * k.tokens * k.ctx > cfg.max_ctx_cells) return std::nullopt;
  return k;
}

// The host plan of a batch as graphs see it (the engine's forward options; no kernel plans).
model::StepPlan host_plan(const model::ForwardBatch& b, const model::StepCapacity* cap) {
  model::StepPlanConfig pc;
  pc.all_logits = false;
  if (cap != nullptr) pc.capacity = *cap;
  return model::StepPlan::build(b, pc);
}
}  // namespace

std::optional<GraphKey> decode_graph_key(const model::StepPlan& p, const GraphPlan& plan) {
  if (p.kind != model::StepKind::decode) return std::nullopt;
  return graph_key(p.num_requests(), 1, p.max_len, !p.logit_rows.empty(), plan);
}

std::optional<GraphKey> decode_graph_key(const model::ForwardBatch& b, const GraphPlan& plan) {
  // What the batch's plan would say (its kind, longest request, gathered logits rows), without building
  // its arrays: a decode step's logits are gathered only for extra rows.
  int64_t max_len = 0;
  for (int64_t r = 0; r < b.num_requests(); ++r)
    max_len = std::max(max_len, b.start_pos[size_t(r)] + b.num_new(r));
  if (model::step_kind(b) != model::StepKind::decode) return std::nullopt;
  return graph_key(b.num_requests(), 1, max_len, !b.extra_logit_rows.empty(), plan);
}

std::optional<GraphKey> spec_graph_key(const model::ForwardBatch& b, int64_t tokens, const GraphPlan& plan) {
  int64_t max_len = 0;
  for (int64_t r = 0; r < b.num_requests(); ++r) {
    if (b.num_new(r) != tokens) return std::nullopt;  // not uniform: eager
    max_len = std::max(max_len, b.start_pos[size_t(r)] + tokens);
  }
  if (b.page_size != plan.config().page_size) return std::nullopt;
  return graph_key(b.num_requests(), tokens, max_len, !b.extra_logit_rows.empty(), plan);
}

DecodeInputLayout decode_input_layout(const GraphKey& k, int64_t page_size) {
  return DecodeInputLayout{k.bs * k.tokens, k.bs, pages_for_ctx(k.ctx, page_size), 0, 0};
}

model::StepCapacity graph_capacity(const GraphKey& k, int64_t page_size) {
  return model::StepCapacity{k.ctx, pages_for_ctx(k.ctx, page_size)};
}

model::ForwardBatch graph_batch(const model::ForwardBatch& b, const GraphKey& k, int32_t scratch_page) {
  const int64_t R = b.num_requests();
  bool uniform = k.tokens >= 1 && k.tokens <= b.page_size;
  for (int64_t r = 0; uniform && r < R; ++r) uniform = b.num_new(r) == k.tokens;
  DSA_CHECK(R <= k.bs && uniform && (k.tokens > 1 || R == 0 || b.all_decoding()),
            "graph batch: {} requests / {} tokens for a graph of {} requests x {} tokens", R, b.num_tokens(),
            k.bs, k.tokens);
  DSA_CHECK(scratch_page >= 0, "graph batch: no scratch page");
  model::ForwardBatch g = b;
  // Every request decoding: a request's logits rows are all its rows (decode: its one token; verify:
  // each), the same rows in the same order as the round's all-logits forward.
  std::fill(g.decoding.begin(), g.decoding.end(), uint8_t(1));
  const std::vector<int32_t> tokens(size_t(k.tokens), 0);
  const int32_t page = scratch_page;
  for (int64_t r = R; r < k.bs; ++r) g.add_request(tokens, 0, std::span<const int32_t>(&page, 1), true);
  return g;
}

model::ForwardBatch padding_batch(const GraphKey& k, int32_t scratch_page, int64_t page_size) {
  model::ForwardBatch b;
  b.page_size = page_size;
  return graph_batch(b, k, scratch_page);
}

void pack_decode_inputs(const model::ForwardBatch& b, const GraphKey& k, int32_t scratch_page,
                        std::span<int32_t> out) {
  const DecodeInputLayout L = decode_input_layout(k, b.page_size);
  DSA_CHECK(int64_t(out.size()) >= L.size(), "pack_decode_inputs: buffer of {} values, the layout needs {}",
            out.size(), L.size());
  const model::StepCapacity cap = graph_capacity(k, b.page_size);
  const model::StepPlan p = host_plan(graph_batch(b, k, scratch_page), &cap);
  DSA_CHECK(p.layout == L, "pack_decode_inputs: the batch's plan does not have the graph's layout");
  p.pack(out);
}

}  // namespace dsaserve::runtime
