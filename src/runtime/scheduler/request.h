#pragma once
// Request: one generation as the scheduler sees it. Its tokens are the prompt followed by what it
// generated so far; kv.len of them have their KV in the cache. Each step feeds tokens[kv.len ..
// kv.len + n): a whole prefill, a chunk of one, or (kv.len == tokens.size() - 1) one decode token.
// Its pages are a KvSeq (runtime/kv/kv_manager.h): the locked cached prefix (kv.prefix_pages pages owned
// by the RadixCache) followed by pages the request owns.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "runtime/kv/kv_manager.h"
#include "runtime/radix/radix_cache.h"
#include "runtime/sampler/sampler.h"

namespace dsaserve::runtime {

enum class FinishReason : uint8_t { none, stop, length, abort, error };

// A token slot whose value a step in flight has not sampled yet (overlap scheduling): the next step's
// batch is built with it and resolved from the request's tokens before that step's forward launches.
inline constexpr int32_t kFutureToken = -1;
const char* finish_reason_name(FinishReason r);

struct Request {
  using Clock = std::chrono::steady_clock;

  uint64_t id = 0;
  uint64_t serial = 0;          // unique per Scheduler::add (ids may be reused after a finish)
  std::vector<int32_t> tokens;  // prompt + output; the last one may be kFutureToken while a step runs
  int64_t prompt_len = 0;
  SamplingParams params;
  SamplerState sampler;

  // Memory.
  KvSeq kv;                                            // page table and committed / reserved lengths
  RadixCache::NodeId prefix_node = RadixCache::kRoot;  // locked while the request holds it (kv's prefix)
  // params.prompt_logprobs: the next prompt position whose logprob is to be reported (1 .. prompt_len;
  // prompt_len: all reported).
  int64_t prompt_logprobs_next = 1;
  // Speculative decoding (runtime/spec): the request drafts (every request when speculation is on);
  // spec_hidden [1, H] is the target's hidden state at kv.len - 1 (set by each step that
  // sampled it; undefined before its first sample and after a retraction).
  bool speculate = false;
  Tensor spec_hidden;
  int64_t spec_verify_ct = 0;        // speculative rounds verified for it
  int64_t spec_accepted_drafts = 0;  // draft tokens they accepted

  // Bookkeeping.
  int64_t cached_tokens = 0;  // prefix-cache hit at first admission (usage.cached_tokens)
  bool admitted_once = false;
  int32_t num_retractions = 0;
  FinishReason finish = FinishReason::none;
  std::string error;
  Clock::time_point arrival = Clock::now();

  // True when the request has reached its length limit (the last token may still be a future one):
  // nothing more is scheduled for it, its pending sample finishes it.
  bool at_length_limit(int64_t max_context) const {
    return num_output() >= params.max_new_tokens ||
           (max_context > 0 && int64_t(tokens.size()) >= max_context);
  }
  int64_t num_output() const { return int64_t(tokens.size()) - prompt_len; }
  int64_t remaining_input() const { return int64_t(tokens.size()) - kv.len; }
  bool finished() const { return finish != FinishReason::none; }
  // Prompt logprobs are still to be reported (such a request does not take prefixes from the cache).
  bool wants_prompt_logprobs() const {
    return params.prompt_logprobs >= 0 && prompt_logprobs_next < prompt_len;
  }
};

}  // namespace dsaserve::runtime
