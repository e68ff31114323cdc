#pragma once
// Parameter accounting from a config alone: every weight (embeddings, lm_head, norms, router gates,
// indexers on full layers only), excluding the MTP layers; "active" counts the routed experts a token
// uses (num_experts_per_tok) instead of all of them.
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace dsaserve::model {

struct ParamGroup {
  std::string name;  // "embed_tokens", "attention", "indexer", "dense_mlp", "router", "routed_experts", ...
  int64_t total = 0;
  int64_t active = 0;
};

struct ParamCount {
  std::vector<ParamGroup> groups;
  int64_t total = 0;
  int64_t active = 0;
  int64_t mtp_total = 0;  // the MTP layers (not in total)
};

// Parameters of one decoder layer's pieces (used by the accounting and the planner).
int64_t attention_params(const ModelConfig& c);  // MLA projections and their norms, no indexer
int64_t indexer_params(const ModelConfig& c);    // wq_b, wk, k_norm (weight + bias), weights_proj
int64_t mlp_params(int64_t hidden, int64_t inter);

ParamCount count_params(const ModelConfig& c);

}  // namespace dsaserve::model
