// AttentionForm::automatic's choice between the MLA forms for a prefill chunk (model.h): FLOP counts of
// each form and the estimated time at measured rates.
#include <algorithm>

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
               mha_attn = dense && r.mha_attn_dense > 0 ? r.mha_attn_dense : r.mha_attn;
  return {(f.absorbed_attn / abs_attn + f.absorb_gemm / r.absorb_gemm) * 1e-12,
          (f.mha_attn / mha_attn + f.expand_gemm / r.expand_gemm) * 1e-12};
}

bool automatic_uses_mha(int64_t mha_min_tokens, const AttentionFormRule& rule, const AttentionShape& s) {
  (void)attention_form_flops(s);  // validates the shape
  const AttentionFormRates& r = s.heads <= rule.narrow_max_heads ? rule.narrow : rule.wide;
  DSA_CHECK(r.absorbed_attn >= 0 && r.absorb_gemm >= 0 && r.mha_attn >= 0 && r.expand_gemm >= 0 &&
                r.absorbed_attn_dense >= 0 && r.mha_attn_dense >= 0,
            "attention form: negative rate for {} heads", s.heads);
  if (s.tokens < mha_min_tokens) return false;
  if (!r.measured()) return true;  // the rule before issue 8
  const AttentionFormSeconds t = attention_form_seconds(s, r);
  return t.mha < t.absorbed;
}

}  // namespace dsaserve::model
