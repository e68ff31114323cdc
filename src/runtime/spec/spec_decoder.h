#pragma once
// SpecDecoder: greedy MTP speculative decoding (EAGLE / NEXTN with one draft chain) of a set of requests
// over a Model, its KvCache and a KvPool. Per round, for every running request:
//   draft         num_steps one-token forwards of the MTP layer (its own KV layer), each fed the previous
//                 token and hidden state (the first: the request's pending token and the target's hidden
//                 state at the position before it);
//   verify        one target forward over the pending token + the drafts (num_steps + 1 rows, logits at
//                 every row); the longest prefix of drafts equal to the target's argmax is accepted, plus
//                 the target's next token (so a round yields 1 .. num_steps + 1 tokens);
//   draft_extend  the MTP layer over the accepted drafts with the target's hidden states, so its KV at
//                 those positions is what a non-speculative MTP pass would hold;
//   rollback      the rejected tokens' KV (target and MTP: one page table) is cut off through the
//                 KvManager (seq_len back, pages past it returned to the pool, no data moved).
// Invariant between rounds (L = the target's committed tokens, tokens[L] the pending token): the target's
// KV holds positions [0, L), the MTP layer's [0, L - 1), `hidden` the target's hidden state at L - 1.
// The prompt is prefilled in chunks (prefill_chunk tokens per request per step), each chunk followed by
// the MTP layer over its positions (the MTP row at p takes tokens[p + 1] and the target's hidden at p).
// Greedy (argmax, ties to the lowest id) only: the output equals non-speculative greedy decoding up to
// the numerics of batching rows differently (the same kernels on the CPU give the same ids).
#include <cstdint>
#include <vector>

#include "model/model.h"
#include "runtime/kv/kv_manager.h"
#include "runtime/kv/kv_pool.h"
#include "runtime/spec/spec_config.h"
#include "runtime/spec/spec_round.h"

namespace dsaserve::runtime {

// Accept statistics: a round's accept length is the tokens it yields (accepted drafts + 1).
struct SpecStats {
  int64_t rounds = 0;    // request-rounds (one per request per verify)
  int64_t drafted = 0;   // draft tokens proposed
  int64_t accepted = 0;  // draft tokens accepted
  int64_t emitted = 0;   // tokens yielded by rounds (accepted + bonus, before the max_new cut)
  std::vector<int64_t> accept_length_hist;  // [num_steps + 2]: rounds per accept length 0 .. num_steps + 1
  double mean_accept_length() const { return rounds > 0 ? double(emitted) / double(rounds) : 0.0; }
  void add_round(int64_t num_steps, int64_t accepted_drafts);
};

struct SpecRequest {
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 16;
};

class SpecDecoder {
 public:
  // `fo`: the target's forward options (its all_logits / keep_hidden are set per pass). `cfg` must be
  // enabled and valid for the model (SpeculativeConfig::validate).
  // `hook` (tests): replaces the MTP layer's drafts (its key: the request's index in generate()'s list).
  SpecDecoder(const model::Model& model, KvPool& pool, SpeculativeConfig cfg, model::ForwardOptions fo = {},
              int64_t prefill_chunk = 0, DraftHook hook = {});
  // Runs every request to its max_new_tokens (no EOS stop) and returns their new tokens. All pages are
  // back in the pool afterwards (also when a forward throws).
  std::vector<std::vector<int32_t>> generate(const std::vector<SpecRequest>& reqs);
  const SpecStats& stats() const { return stats_; }

 private:
  struct Seq;
  void prefill(std::vector<Seq>& seqs);
  void round(std::vector<Seq*>& live);
  void release(Seq& s);

  const model::Model& model_;
  KvPool& pool_;
  KvManager kv_;
  SpeculativeConfig cfg_;
  model::ForwardOptions fo_;
  int64_t prefill_chunk_;
  DraftHook hook_;
  SpecStats stats_;
};

}  // namespace dsaserve::runtime
