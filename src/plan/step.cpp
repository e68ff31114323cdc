// plan_step: the passes of one engine step over an exact batch (plan/step.h).
#include "plan/step.h"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "model/model.h"
#include "plan/builder.h"
#include "plan/cost.h"

namespace dsaserve::plan {

using detail::PassTokens;

namespace {

// Keys a causal attention reads for the queries at positions s0+1 .. s0+n (1-based), each capped at K
// (K < 0: no cap).
double causal_keys(double s0, double n, double K) {
  if (K < 0) return s0 * n + n * (n + 1) / 2;
  return detail::causal_topk_keys(s0 + n, K) - detail::causal_topk_keys(s0, K);
}

}  // namespace

Pass plan_step(const model::ModelConfig& c, const Deployment& d, const Hardware& hw, const StepShape& s) {
  DSA_CHECK(!s.requests.empty(), "plan_step: the step has no requests");
  PassTokens t;
  t.prefill = !s.decode;
  t.occurrences = 1;
  const bool dsa = c.has_indexer();
  // The pass's attention form: the engine's (model::automatic_uses_mha with the default ForwardOptions) when
  // every request of a prefill step takes the MHA form, else the absorbed form (a step that mixes both is
  // billed absorbed; decode steps always are).
  const model::ForwardOptions fo;
  bool mha = t.prefill;
  for (const StepRequest& r : s.requests) {
    if (!mha) break;
    model::AttentionShape a =
        model::attention_dims(c, std::max<int64_t>(1, c.num_attention_heads / d.attn_tp()));
    a.tokens = r.new_tokens;
    a.context = r.cached;
    mha = r.new_tokens > 0 && r.cached >= 0 && model::automatic_uses_mha(fo.mha_min_tokens, fo.form_rule, a);
  }
  t.mha_form = mha;
  const double K = double(c.index_topk);
  int64_t T = 0, ctx = 0;
  for (const StepRequest& r : s.requests) {
    DSA_CHECK(r.new_tokens > 0 && r.cached >= 0, "plan_step: a request with {} new tokens after {} cached",
              r.new_tokens, r.cached);
    DSA_CHECK(!s.decode || r.new_tokens == 1, "plan_step: a decoding request with {} new tokens",
              r.new_tokens);
    const double s0 = double(r.cached), n = double(r.new_tokens), S = s0 + n;
    T += r.new_tokens;
    ctx = std::max(ctx, r.cached + r.new_tokens);
    t.attn_keys += causal_keys(s0, n, dsa ? K : -1);
    if (mha) {
      t.expand_tokens += S;  // every cached and new latent row expanded once
    } else if (dsa) {
      t.attn_kv_tokens += causal_keys(s0, n, K);  // each query reads its own selected rows
    } else {
      t.attn_kv_tokens += S;  // the queries of one request share one pass over its cache
    }
    t.indexer_keys += causal_keys(s0, n, -1);
    t.indexer_kv_tokens += S;
  }
  const double dp = double(d.attn_dp_size);
  t.requests = double(s.requests.size());
  t.tokens = double(T);
  t.tokens_global = double(T) * dp;
  if (!s.dp_tokens.empty()) {  // the rows the world gathers carried (model/shard.h RowSplit)
    DSA_CHECK(int64_t(s.dp_tokens.size()) == d.attn_dp_size,
              "plan_step: {} DP token counts for --attn-dp-size {}", s.dp_tokens.size(), d.attn_dp_size);
    const int64_t atp = d.attn_tp();
    int64_t sum = 0, block = 0;
    for (int64_t n : s.dp_tokens) {
      sum += n;
      block = std::max(block, (n + atp - 1) / atp);  // the largest slice (tensor_split: the first ones)
    }
    t.tokens_global = s.dp_equal ? double(block * d.tp) : double(sum);
    t.dispatch_tokens = double(sum);
  }
  t.gather_tokens = t.tokens_global;
  t.logit_tokens = s.all_logits ? double(T) : t.requests;
  t.norm_tokens = double(T);
  t.tokens_shape = T;
  t.tokens_global_shape = int64_t(t.tokens_global);
  t.context_shape = ctx;
  const detail::Builder b(c, d, hw);
  const char* name =
      !s.mtp ? (s.decode ? "decode" : "prefill") : (s.decode ? "draft" : "prefill_draft_extend");
  return detail::make_pass(b, c, name, s.mtp, 1, t);
}

StepTotals step_totals(const std::vector<Pass>& passes, int64_t tp) {
  StepTotals s;
  for (const Pass& p : passes) detail::add_totals(s, p, tp);
  s.time_s = s.op_time_s + s.comm_s;
  return s;
}

Deployment parse_deployment(const std::string& spec, const model::ModelConfig& c) {
  Deployment d;
  std::stringstream ss(spec);
  bool any = false;
  for (std::string item; std::getline(ss, item, ',');) {
    any = true;
    auto number = [&](size_t prefix) {
      const std::string v = item.substr(prefix);
      DSA_CHECK(!v.empty() && v.size() < 10 &&
                    std::all_of(v.begin(), v.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) &&
                    std::stoll(v) > 0,
                "deployment '{}': '{}' needs a positive number", spec, item);
      return int64_t(std::stoll(v));
    };
    if (item.rfind("tp", 0) == 0) {
      d.tp = number(2);
    } else if (item.rfind("ep", 0) == 0) {
      d.ep_size = number(2);
    } else if (item.rfind("dp", 0) == 0) {
      d.attn_dp_size = number(2);
    } else if (item == "deepep") {
      d.moe_a2a_backend = A2aBackend::deepep;
    } else if (item == "fp8") {
      d.kv_cache_dtype = KvDtype::fp8_e4m3;
    } else {
      fail("deployment '{}': unknown item '{}' (expected tpN, epN, dpN, deepep, fp8)", spec, item);
    }
  }
  DSA_CHECK(any, "deployment: empty (expected e.g. tp8,ep8,dp8)");
  d.validate(c);
  return d;
}

}  // namespace dsaserve::plan
