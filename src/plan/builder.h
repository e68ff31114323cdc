#pragma once
// Internal to the planner: builds the op chain and collectives of one layer kind, the embedding and the
// head of one pass, from the token counts of that pass.
#include <string>

#include "model/config.h"
#include "plan/plan.h"

namespace dsaserve::plan::detail {

// Token counts of one pass on one rank. Sums are over prefill chunks (`occurrences` of the pass);
// `*_shape` are the sizes of one occurrence, for the shape strings and the expert-touch estimate.
struct PassTokens {
  bool prefill = false;
  double occurrences = 1;        // prefill chunks (weights are read once per chunk); 1 for decode passes
  double tokens = 0;             // T: tokens this rank attends for
  double requests = 0;           // R: requests on this rank's attention group
  double tokens_global = 0;      // Tg: tokens of the whole deployment (decode: batch x tokens per request)
  double gather_tokens = 0;      // rows of a DP all-gather: decode pads every rank to the largest (R x dp)
  double logit_tokens = 0;       // tokens that reach the LM head
  double attn_keys = 0;          // sum over queries of the keys the main attention reads
  double attn_kv_tokens = 0;     // latent cache rows the main attention reads from HBM
  double indexer_keys = 0;       // sum over queries of the keys the indexer scores
  double indexer_kv_tokens = 0;  // indexer cache rows read from HBM
  bool mha_form = false;         // the pass runs MLA's MHA form (else the absorbed form)
  double expand_tokens = 0;      // MHA form: latent rows expanded by kv_b_proj
  int64_t tokens_shape = 0, tokens_global_shape = 0, context_shape = 0;
  double norm_tokens = -1;  // rows of the final norm; < 0: logit_tokens (the engine's step: every token)
  // DeepEP under DP attention: the deployment's tokens without a decode gather's padding (what the ranks
  // dispatch); < 0: tokens_global.
  double dispatch_tokens = -1;
};

// Sum over positions 1..P of min(K, pos): keys a causal top-K attention reads over a P-token prompt.
double causal_topk_keys(double P, double K);

class Builder {
 public:
  Builder(const model::ModelConfig& c, const Deployment& d, const Hardware& hw) : c_(c), d_(d), hw_(hw) {}

  // One decoder layer of the given kind (mtp: the MTP layer with its eh_proj and a full indexer).
  LayerKindPlan layer(const std::string& name, bool dense, bool full_indexer, bool mtp,
                      const PassTokens& p) const;
  // Embedding (+ its all-reduce) and final norm / LM head / sampling (+ the logits gather).
  void head(Pass& pass, const PassTokens& p) const;
  void tail(Pass& pass, const PassTokens& p) const;

 private:
  Op op(std::string name, OpKind kind, Precision prec, std::string shape, double flops, double weight,
        double act_read, double act_write, double kv_read = 0, double kv_write = 0) const;
  Collective coll(std::string name, CollKind kind, std::string group, int64_t group_size, std::string after,
                  double count, double bytes, double scale_bytes = 0, double meta_bytes = 0) const;
  void attention(LayerKindPlan& lp, bool full_indexer, const PassTokens& p) const;
  void dense_mlp(LayerKindPlan& lp, const PassTokens& p) const;
  void moe(LayerKindPlan& lp, const PassTokens& p) const;

  const model::ModelConfig& c_;
  const Deployment& d_;
  const Hardware& hw_;
};

// One forward pass (the decoder stack, or the MTP layer) over the given token counts; totals of passes.
Pass make_pass(const Builder& b, const model::ModelConfig& c, std::string name, bool mtp, int64_t repeat,
               const PassTokens& t);
void add_totals(StepTotals& s, const Pass& pass, int64_t tp);

}  // namespace dsaserve::plan::detail
