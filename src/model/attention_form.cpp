// AttentionForm::automatic's choice between the MLA forms for a prefill chunk (model.h): FLOP counts of
// each form and the estimated time at measured rates.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "model/model.h"

namespace dsaserve::model {

namespace {
// Keys the rows of one request attend in total: row t sees context + t + 1 positions, of which it
// attends min(topk, visible) (topk 0: all).
double attended_keys(const AttentionShape& s) {
  const double a = double(s.context) + 1, b = double(s.context + s.tokens);
  if (s.tokens == 0) return 0;
  if (s.topk <= 0 || double(s.topk) >= b) return (a + b) * (b - a + 1) / 2;
  const double k = double(s.topk);
  const double below = a <= k ? (a + k) * (k - a + 1) / 2 : 0;  // rows seeing at most topk keys
  return below + (b - std::max(a, k + 1) + 1) * k;
}
}  // namespace

double RateByTokens::at(int64_t t) const {
  if (!set()) return 0;
  int n = 0;
  while (n < kPoints && tokens[size_t(n)] > 0) ++n;
  if (t <= tokens[0]) return tflops[0] * double(std::max<int64_t>(t, 0)) / double(tokens[0]);
  for (int i = 1; i < n; ++i) {
    if (t <= tokens[size_t(i)]) {
      const double a = std::log2(double(tokens[size_t(i - 1)])), b = std::log2(double(tokens[size_t(i)]));
      const double w = (std::log2(double(t)) - a) / (b - a);
      return tflops[size_t(i - 1)] + w * (tflops[size_t(i)] - tflops[size_t(i - 1)]);
    }
  }
  return tflops[size_t(n - 1)];
}

std::string RateByTokens::problem() const {
  bool ended = false;
  for (int i = 0; i < kPoints; ++i) {
    const int64_t t = tokens[size_t(i)];
    const double r = tflops[size_t(i)];
    if (t == 0) {
      if (r != 0) return "a rate without its token count";
      ended = true;
      continue;
    }
    if (ended || t < 1 || (i > 0 && t <= tokens[size_t(i - 1)]))
      return "token counts must ascend from 1 with no gaps";
    if (!(r > 0)) return "rates must be positive";
  }
  return "";
}

AttentionShape attention_dims(const ModelConfig& c, int64_t heads) {
  AttentionShape s;
  s.heads = heads;
  s.topk = c.has_indexer() ? c.index_topk : 0;
  s.latent = c.kv_lora_rank;
  s.rope = c.qk_rope_head_dim;
  s.nope = c.qk_nope_head_dim;
  s.dv = c.v_head_dim;
  return s;
}

AttentionFormFlops attention_form_flops(const AttentionShape& s) {
  DSA_CHECK(s.tokens >= 0 && s.context >= 0 && s.heads > 0 && s.topk >= 0 && s.latent > 0 && s.rope >= 0 &&
                s.nope > 0 && s.dv > 0,
            "attention form: bad shape (tokens {}, context {}, heads {}, topk {}, dims {}/{}/{}/{})",
            s.tokens, s.context, s.heads, s.topk, s.latent, s.rope, s.nope, s.dv);
  const double keys = attended_keys(s), h = double(s.heads),
               expand = 2.0 * double(s.latent * (s.nope + s.dv));
  AttentionFormFlops f;
  f.absorbed_attn = keys * h * 2.0 * double(2 * s.latent + s.rope);
  f.absorb_gemm = double(s.tokens) * h * expand;
  f.mha_attn = keys * h * 2.0 * double(s.nope + s.rope + s.dv);
  f.expand_gemm = double(s.context + s.tokens) * h * expand;
  return f;
}

AttentionFormSeconds attention_form_seconds(const AttentionShape& s, const AttentionFormRates& r) {
  DSA_CHECK(r.measured(),
            "attention form: rates must all be positive (absorbed {}, absorb {}, mha {}, expand {})",
            r.absorbed_attn, r.absorb_gemm, r.mha_attn, r.expand_gemm);
  const AttentionFormFlops f = attention_form_flops(s);
  const bool dense = s.topk <= 0 || s.context + s.tokens <= s.topk;  // no selection: every key, causally
  const double abs_attn = dense && r.absorbed_attn_dense > 0 ? r.absorbed_attn_dense : r.absorbed_attn,
               mha_attn = dense && r.mha_attn_dense.set() ? r.mha_attn_dense.at(s.tokens) : r.mha_attn;
  // (A chunk of no tokens attends no keys: its attention terms are 0 whatever the rate.)
  const double mha_attn_s = f.mha_attn > 0 ? f.mha_attn / mha_attn : 0;
  return {(f.absorbed_attn / abs_attn + f.absorb_gemm / r.absorb_gemm) * 1e-12,
          (mha_attn_s + f.expand_gemm / r.expand_gemm) * 1e-12};
}

bool automatic_uses_mha(int64_t mha_min_tokens, const AttentionFormRule& rule, const AttentionShape& s) {
  (void)attention_form_flops(s);  // validates the shape
  const AttentionFormRates& r = s.heads <= rule.narrow_max_heads ? rule.narrow : rule.wide;
  DSA_CHECK(r.absorbed_attn >= 0 && r.absorb_gemm >= 0 && r.mha_attn >= 0 && r.expand_gemm >= 0 &&
                r.absorbed_attn_dense >= 0,
            "attention form: negative rate for {} heads", s.heads);
  const std::string dense_problem = r.mha_attn_dense.problem();
  DSA_CHECK(dense_problem.empty(), "attention form: mha_attn_dense for {} heads: {}", s.heads, dense_problem);
  if (s.tokens < mha_min_tokens) return false;
  if (!r.measured()) return true;  // the rule before issue 8
  const AttentionFormSeconds t = attention_form_seconds(s, r);
  return t.mha < t.absorbed;
}

}  // namespace dsaserve::model
