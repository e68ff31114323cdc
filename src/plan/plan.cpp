// build_plan: the passes of a prefill and of one decode step, their token counts, and the totals.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "plan/builder.h"
#include "plan/cost.h"

namespace dsaserve::plan {

using detail::Builder;
using detail::ceil_div;
using detail::PassTokens;
using model::ModelConfig;

namespace detail {

double causal_topk_keys(double P, double K) {
  if (P <= K) return P * (P + 1) / 2;
  return K * (K + 1) / 2 + (P - K) * K;
}

}  // namespace detail

using detail::causal_topk_keys;

namespace {

PassTokens decode_tokens(const ModelConfig& c, const Deployment& d, int64_t per_request, bool extend) {
  PassTokens t;
  const double R = double(ceil_div(d.batch, d.attn_dp_size)), q = double(per_request), S = double(d.context);
  t.requests = R;
  t.tokens = R * q;
  t.tokens_global = double(d.batch) * q;
  t.gather_tokens = t.tokens * double(d.attn_dp_size);  // all_gather_into_tensor pads to equal rows
  t.logit_tokens = extend ? R : t.tokens;
  if (c.has_indexer()) {
    t.attn_keys = t.tokens * std::min(double(c.index_topk), S);
    t.attn_kv_tokens = t.attn_keys;  // each query reads its own selected rows
  } else {
    t.attn_keys = t.tokens * S;
    t.attn_kv_tokens = R * S;  // the queries of one request share one pass over its cache
  }
  t.indexer_keys = t.tokens * S;
  t.indexer_kv_tokens = R * S;
  t.tokens_shape = int64_t(t.tokens);
  t.tokens_global_shape = int64_t(t.tokens_global);
  t.context_shape = d.context;
  return t;
}

PassTokens prefill_tokens(const ModelConfig& c, const Deployment& d) {
  PassTokens t;
  const int64_t P = d.prefill(), C = std::min(d.chunk(), P), chunks = ceil_div(P, C);
  t.prefill = true;
  t.occurrences = double(chunks);
  t.requests = 1;
  t.tokens = double(P);
  t.tokens_global = double(P);  // one request, on one attention group
  t.gather_tokens = double(P);  // variable-length gather: only the owning rank contributes rows
  t.logit_tokens = 1;
  double ends = 0;  // sum over chunks of (prefix + chunk): rows each chunk reads from the caches
  for (int64_t j = 0; j < chunks; ++j) ends += double(std::min((j + 1) * C, P));
  // The deployment bill's form: the absorbed form with an indexer (the reference's path for DSA models), the
  // MHA form without one. plan_step (one engine step) follows the engine's automatic rule per request
  // instead.
  t.mha_form = !c.has_indexer();
  t.attn_keys = c.has_indexer() ? causal_topk_keys(double(P), double(c.index_topk)) : double(P) * (P + 1) / 2;
  t.attn_kv_tokens = c.has_indexer() ? t.attn_keys : 0;
  t.expand_tokens = c.has_indexer() ? 0 : ends;
  t.indexer_keys = double(P) * (P + 1) / 2;
  t.indexer_kv_tokens = ends;
  t.tokens_shape = C;
  t.tokens_global_shape = C;
  t.context_shape = P;
  return t;
}

}  // namespace

namespace detail {

std::string layer_kind_name(model::MlpType m, model::IndexerType ix) {
  return fmt::format("{}.{}", m == model::MlpType::dense ? "dense" : "moe",
                     ix == model::IndexerType::full     ? "full"
                     : ix == model::IndexerType::shared ? "shared"
                                                        : "none");
}

Pass make_pass(const Builder& b, const ModelConfig& c, std::string name, bool mtp, int64_t repeat,
               const PassTokens& t) {
  Pass pass;
  pass.name = std::move(name);
  pass.repeat = repeat;
  pass.mtp = mtp;
  pass.requests_local = int64_t(t.requests);
  pass.tokens_local = t.tokens_shape;
  pass.tokens_global = t.tokens_global_shape;
  pass.chunks = int64_t(t.occurrences);
  b.head(pass, t);
  if (mtp) {
    LayerKindPlan lp = b.layer("mtp", false, c.has_indexer(), true, t);
    lp.layers = {c.num_hidden_layers};
    pass.layer_kinds.push_back(std::move(lp));
  } else {
    std::map<std::string, size_t> index;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const auto m = c.mlp_layer_types[size_t(l)];
      const auto ix = c.has_indexer() ? c.indexer_types[size_t(l)] : model::IndexerType::none;
      const std::string kind = layer_kind_name(m, ix);
      auto it = index.find(kind);
      if (it == index.end()) {
        it = index.emplace(kind, pass.layer_kinds.size()).first;
        pass.layer_kinds.push_back(
            b.layer(kind, m == model::MlpType::dense, ix == model::IndexerType::full, false, t));
      }
      pass.layer_kinds[it->second].layers.push_back(l);
    }
  }
  b.tail(pass, t);
  return pass;
}

void add_totals(StepTotals& s, const Pass& pass, int64_t tp) {
  const double rep = double(pass.repeat);
  auto add_op = [&](const Op& o, double times) {
    s.flops += o.flops * times;
    s.weight_bytes += o.weight_bytes * times;
    s.act_bytes += (o.act_read_bytes + o.act_write_bytes) * times;
    s.kv_read_bytes += o.kv_read_bytes * times;
    s.kv_write_bytes += o.kv_write_bytes * times;
    s.compute_floor_s += o.compute_s * times;
    s.memory_floor_s += o.memory_s * times;
    s.op_time_s += o.time_s() * times;
  };
  auto add_coll = [&](const Collective& col, double times) {
    const double n = double(col.count) * times;
    if (!col.runs) {  // the article's bill only
      s.article_bytes_per_output_token += col.bytes * n;
      return;
    }
    s.collectives += int64_t(std::llround(n));
    s.comm_bytes += col.bytes * n;
    s.comm_wire_bytes += col.wire_bytes * n;
    s.comm_s += col.time_s * n;
    // The article counts one tensor per ring collective, and all ranks' sends for dispatch/combine.
    const bool a2a = col.kind == CollKind::dispatch || col.kind == CollKind::combine;
    if (col.article) s.article_bytes_per_output_token += (a2a ? col.bytes * double(tp) : col.bytes) * n;
  };
  for (const Op& o : pass.head_ops) add_op(o, rep);
  for (const Collective& col : pass.head_collectives) add_coll(col, rep);
  for (const LayerKindPlan& lp : pass.layer_kinds) {
    const double times = rep * double(lp.layers.size());
    for (const Op& o : lp.ops) add_op(o, times);
    for (const Collective& col : lp.collectives) add_coll(col, times);
  }
  for (const Op& o : pass.tail_ops) add_op(o, rep);
  for (const Collective& col : pass.tail_collectives) add_coll(col, rep);
}

}  // namespace detail

using detail::add_totals;
using detail::make_pass;

namespace {

void finish_totals(StepPlan& step, int64_t tp, double output_tokens) {
  StepTotals& s = step.totals;
  s = StepTotals{};
  for (const Pass& p : step.passes) add_totals(s, p, tp);
  s.time_s = s.op_time_s + s.comm_s;
  s.output_tokens = output_tokens;
  s.wire_bytes_per_output_token = s.comm_wire_bytes * double(tp) / output_tokens;
  s.article_bytes_per_output_token /= output_tokens;
}

std::string gb(double b) { return fmt::format("{:.2f} GB", b / 1e9); }

}  // namespace

Plan build_plan(const ModelConfig& c, const Deployment& d, const Hardware& hw) {
  d.validate(c);
  Plan plan;
  plan.model_type = c.model_type;
  plan.deployment = d;
  plan.hardware = hw;
  plan.memory = plan_memory(c, d, hw);
  const Builder b(c, d, hw);
  const int64_t N = d.speculative_num_draft_tokens;

  plan.prefill.name = "prefill";
  const PassTokens pt = prefill_tokens(c, d);
  plan.prefill.passes.push_back(make_pass(b, c, "prefill", false, 1, pt));
  if (N > 0) plan.prefill.passes.push_back(make_pass(b, c, "prefill_draft_extend", true, 1, pt));
  finish_totals(plan.prefill, d.tp, 1.0);

  plan.decode.name = "decode";
  if (N == 0) {
    plan.decode.passes.push_back(make_pass(b, c, "decode", false, 1, decode_tokens(c, d, 1, false)));
  } else {
    plan.decode.passes.push_back(make_pass(b, c, "draft", true, N - 1, decode_tokens(c, d, 1, false)));
    plan.decode.passes.push_back(make_pass(b, c, "verify", false, 1, decode_tokens(c, d, N, false)));
    plan.decode.passes.push_back(make_pass(b, c, "draft_extend", true, 1, decode_tokens(c, d, N, true)));
  }
  finish_totals(plan.decode, d.tp, double(d.batch) * d.accept_length);

  const MemoryPlan& m = plan.memory;
  if (m.kv_pool_bytes <= 0) {
    plan.notes.push_back(fmt::format(
        "the weights ({} per GPU) exceed --mem-fraction-static {} x {} = {}: this deployment cannot start",
        gb(m.weights_bytes), d.mem_fraction_static, gb(hw.memory_bytes), gb(m.budget_bytes)));
  } else if (!m.batch_fits) {
    plan.notes.push_back(fmt::format(
        "--batch {} at --context {} does not fit: {} of KV pool per GPU holds {} tokens, {} request(s) per "
        "attention group, {} in all",
        d.batch, d.context, gb(m.kv_pool_bytes), m.kv_tokens_fit, m.max_requests_per_dp_group,
        m.max_requests));
  }
  if (d.moe_a2a_backend == A2aBackend::deepep && d.attn_dp_size > 1) {
    plan.notes.push_back(
        "DP attention + DeepEP: the reference article also bills a DP all-gather/reduce-scatter around each "
        "MoE layer; DeepEP dispatches each rank's own rows, so those are in its count only (runs: false; "
        "see docs/plan.md)");
  }
  if (N > 0 && d.accept_length == 1.0) {
    plan.notes.push_back(
        "per-output-token figures assume 1 accepted token per request per step; pass --accept-length");
  }
  return plan;
}

}  // namespace dsaserve::plan
