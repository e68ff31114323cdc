#pragma once
// One rank's part of the weights under a parallel layout (dist/layout.h), as SGLang's linear layers split
// them (the reference article, sections 4.2-4.8):
//   replicated       q_a / kv_a projections and their norms, the indexer (wq_b, wk, weights_proj), the
//                    router gate and bias, the layer norms, the final norm, MTP's norms and eh_proj
//   column-parallel  q_b_proj and kv_b_proj by heads over the attention TP group; the dense MLP's gate/up
//                    over the dense TP group; each expert's gate/up (and the shared expert's) over MoE TP
//   row-parallel     o_proj over attention TP; the dense down over dense TP; expert downs over MoE TP
//   vocab-parallel   the embedding and the LM head by vocabulary rows over attention TP
//   expert-parallel  the routed experts by ep_rank: rank e holds experts [e E / ep, (e + 1) E / ep)
// Column shards are views of the bound tensors (a checkpoint's mmap: only the shard's pages are read);
// row shards and the embedding shard (one zero row appended, the row of every token outside this rank's
// vocabulary) are copies of the shard alone. FP8 block scales are split with their weights.
#include <cstdint>
#include <vector>

#include "dist/layout.h"
#include "model/config.h"
#include "model/weights.h"

namespace dsaserve::model {

// This rank's place in the layout, with the widths its shards have.
struct Shard {
  dist::ParallelLayout layout;  // default: one process, every weight whole
  int64_t rank = 0;
  bool whole() const { return layout.tp == 1; }
  int64_t attn_tp() const { return layout.attn_tp(); }
  int64_t attn_tp_rank() const { return layout.attn_tp_rank(rank); }
  int64_t moe_tp() const { return layout.moe_tp(); }
  int64_t moe_tp_rank() const { return layout.moe_tp_rank(rank); }
  int64_t ep_rank() const { return layout.ep_rank(rank); }
  int64_t dense_tp() const { return layout.dense_tp(); }
  int64_t dense_tp_rank() const { return dense_tp() == 1 ? 0 : rank; }
  // The vocabulary rows of this rank: [vocab_begin, vocab_begin + vocab_rows).
  int64_t vocab_rows(const ModelConfig& c) const { return c.vocab_size / attn_tp(); }
  int64_t vocab_begin(const ModelConfig& c) const { return attn_tp_rank() * vocab_rows(c); }
  // The routed experts of this rank: [expert_begin, expert_begin + local_experts).
  int64_t local_experts(const ModelConfig& c) const { return c.n_routed_experts / layout.ep_size; }
  int64_t expert_begin(const ModelConfig& c) const { return ep_rank() * local_experts(c); }
  // Throws dsaserve::Error naming the size that does not split (heads, vocabulary, intermediate sizes,
  // experts, FP8 blocks) and the flag that asked for it.
  void validate(const ModelConfig& c) const;
};

// Where one step's token rows live when the MLP side sees other ranks' rows (SGLang's scattered mode:
// attention DP, and DeepEP's dispatch under attention TP). Each DP group runs its own tokens; within its
// attention TP group the rows are split in order (torch's tensor_split: the first T % attn_tp ranks one
// more): rank (d, a) holds the rows [begin, end) of group d's tokens. The world's ranks, in order, hold
// every DP group's tokens in order.
struct RowSplit {
  std::vector<int64_t> dp_tokens;  // per DP group: its tokens this step (0: an idle group)
  bool equal = false;              // decode: the world gathers pad every rank to `block` rows
  std::vector<int64_t> rank_rows;  // per world rank: the rows of its slice
  std::vector<int64_t> attn_rows;  // per attention TP rank of this rank's group
  int64_t begin = 0, end = 0;      // this rank's slice of its group's tokens
  int64_t block = 0;               // max over rank_rows
  int64_t rows() const { return end - begin; }
  int64_t world_rows() const;  // rows of a world gather: equal ? ranks x block : the sum
  // Throws dsaserve::Error when dp_tokens has not one entry per DP group.
  static RowSplit make(const Shard& s, std::vector<int64_t> dp_tokens, bool equal);
};

// The shard of `w` (bound whole for `c`) that `s.rank` holds.
ModelWeights shard_weights(const ModelWeights& w, const ModelConfig& c, const Shard& s);

}  // namespace dsaserve::model
