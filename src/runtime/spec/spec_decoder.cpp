#include "runtime/spec/spec_decoder.h"

#include <algorithm>

#include "core/error.h"
#include "runtime/spec/spec_round.h"
#include "trace/trace.h"

namespace dsaserve::runtime {

void SpecStats::add_round(int64_t num_steps, int64_t accepted_drafts) {
  if (accept_length_hist.size() < size_t(num_steps + 2)) accept_length_hist.resize(size_t(num_steps + 2), 0);
  rounds += 1;
  drafted += num_steps;
  accepted += accepted_drafts;
  emitted += accepted_drafts + 1;
  accept_length_hist[size_t(accepted_drafts + 1)] += 1;
}

struct SpecDecoder::Seq {
  std::vector<int32_t> tokens;  // prompt + output; after the prefill tokens[kv.len] is the pending token
  int64_t prompt_len = 0;
  int64_t max_new = 0;
  KvSeq kv;
  uint64_t key = 0;
  Tensor hidden;  // [1, H]: the target's hidden state at kv.len - 1
  bool done = false;
  int64_t num_output() const { return int64_t(tokens.size()) - prompt_len; }
};

SpecDecoder::SpecDecoder(const model::Model& model, KvPool& pool, SpeculativeConfig cfg,
                         model::ForwardOptions fo, int64_t prefill_chunk, DraftHook hook)
    : model_(model),
      pool_(pool),
      kv_(pool),
      cfg_(cfg.resolved()),
      fo_(fo),
      prefill_chunk_(prefill_chunk),
      hook_(std::move(hook)) {
  cfg_.validate(model.num_mtp_layers());
  DSA_CHECK(cfg_.enabled(), "spec: speculative decoding is off (--speculative-algorithm)");
  DSA_CHECK(int64_t(pool.cache().kv.size()) > model.config().num_hidden_layers,
            "spec: the KV cache has no MTP layer");
  fo_.inputs = nullptr;
  stats_.accept_length_hist.assign(size_t(cfg_.num_steps + 2), 0);
}

void SpecDecoder::release(Seq& s) {
  const std::vector<int32_t> full = kv_.release(s.kv);
  pool_.free(full);  // no prefix cache here: every page goes back
}

std::vector<std::vector<int32_t>> SpecDecoder::generate(const std::vector<SpecRequest>& reqs) {
  std::vector<Seq> seqs(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    DSA_CHECK(!reqs[i].prompt.empty(), "spec: request {} has an empty prompt", i);
    seqs[i].key = i;
    seqs[i].tokens = reqs[i].prompt;
    seqs[i].prompt_len = int64_t(reqs[i].prompt.size());
    seqs[i].max_new = reqs[i].max_new_tokens;
    seqs[i].done = reqs[i].max_new_tokens <= 0;
  }
  try {
    prefill(seqs);
    for (;;) {
      std::vector<Seq*> live;
      for (Seq& s : seqs) {
        if (!s.done && s.num_output() >= s.max_new) {
          s.done = true;
          release(s);
        }
        if (!s.done) live.push_back(&s);
      }
      if (live.empty()) break;
      round(live);
    }
  } catch (...) {
    for (Seq& s : seqs) {
      if (!s.kv.empty()) release(s);
    }
    throw;
  }
  std::vector<std::vector<int32_t>> out;
  for (Seq& s : seqs) {
    if (!s.kv.empty()) release(s);
    out.emplace_back(s.tokens.begin() + s.prompt_len,
                     s.tokens.begin() + s.prompt_len + std::min<int64_t>(s.num_output(), s.max_new));
  }
  return out;
}

void SpecDecoder::prefill(std::vector<Seq>& seqs) {
  const int64_t V = model_.config().vocab_size;
  for (;;) {
    // One step: the next chunk of every request whose prompt is not all in the KV yet.
    std::vector<Seq*> step;
    model::ForwardBatch fb, mb;
    fb.page_size = mb.page_size = kv_.page_size();
    std::vector<int64_t> begin, end;
    for (Seq& s : seqs) {
      if (s.done || s.kv.len >= s.prompt_len) continue;
      const int64_t a = s.kv.len;
      const int64_t n = prefill_chunk_ > 0 ? std::min(prefill_chunk_, s.prompt_len - a) : s.prompt_len - a;
      // The pending token and the drafts of the first round are reserved with it.
      kv_.reserve(s.kv, a + n >= s.prompt_len ? n + cfg_.verify_rows() : n);
      fb.add_request(std::span<const int32_t>(s.tokens).subspan(size_t(a), size_t(n)), a, s.kv.pages, false);
      step.push_back(&s);
      begin.push_back(a);
      end.push_back(a + n);
    }
    if (step.empty()) return;
    model::ForwardOptions fo = fo_;
    fo.all_logits = false;
    fo.keep_hidden = true;
    model::ForwardOutput out;
    {
      trace::Scope span("prefill", "spec");
      out = model_.forward(fb, pool_.cache(), fo);
    }
    const Tensor logits =
        (out.logits.device() == Device::cpu ? out.logits : out.logits.to(Device::cpu)).contiguous();
    // The MTP layer over the chunk's positions p < prompt_len - 1 (its token p is tokens[p + 1]).
    std::vector<Tensor> rows;
    for (size_t r = 0; r < step.size(); ++r) {
      Seq& s = *step[r];
      kv_.commit(s.kv, end[r] - begin[r]);
      const int64_t m = std::min(end[r], s.prompt_len - 1) - begin[r];
      const int64_t t0 = fb.token_begin[r];
      if (m > 0) {
        mb.add_request(std::span<const int32_t>(s.tokens).subspan(size_t(begin[r] + 1), size_t(m)), begin[r],
                       s.kv.pages, false);
        rows.push_back(out.hidden.slice(0, t0, t0 + m));
      }
      if (end[r] == s.prompt_len) {
        s.tokens.push_back(greedy_token(logits.data<float>() + int64_t(r) * V, V));
        s.hidden = out.hidden.slice(0, fb.token_begin[r + 1] - 1, fb.token_begin[r + 1]);
      }
    }
    mtp_extend(model_, pool_.cache(), fo_, mb, rows);
  }
}

void SpecDecoder::round(std::vector<Seq*>& live) {
  const int64_t N = cfg_.num_steps, K = cfg_.verify_rows();
  std::vector<SpecSlot> slots;
  for (Seq* s : live) {
    // Room for the pending token and the drafts (the first round's was reserved with the prefill).
    if (s->kv.reserved < s->kv.len + K) kv_.reserve(s->kv, K);
    slots.push_back({s->key, s->tokens.back(), s->kv.len, s->kv.pages, s->hidden});
  }
  const SpecVerdict v = draft_and_verify(model_, pool_.cache(), fo_, N, slots, hook_);
  for (Seq* s : live) kv_.commit(s->kv, K);
  draft_extend(model_, pool_.cache(), fo_, N, slots, v);
  for (size_t r = 0; r < live.size(); ++r) {
    Seq& s = *live[r];
    const int64_t j = v.accepted[r];
    stats_.add_round(N, j);
    s.tokens.insert(s.tokens.end(), v.run[r].begin(), v.run[r].end());
    // The target KV keeps the pending token and the j accepted drafts; the rest returns to the pool.
    kv_.rollback(s.kv, slots[r].len + j + 1);
    s.hidden = next_hidden(v, N, r);
  }
}

}  // namespace dsaserve::runtime
