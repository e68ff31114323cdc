#include "runtime/scheduler/scheduler.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <unordered_set>

#include "core/error.h"
#include "core/parallel.h"

namespace dsaserve::runtime {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::none: return "none";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::abort: return "abort";
    case FinishReason::error: return "error";
  }
  return "none";
}

Scheduler::Scheduler(SchedulerConfig cfg, KvPool& pool, RadixCache& cache)
    : cfg_(std::move(cfg)), kv_(pool), cache_(cache), output_(cfg_.eos_token_ids, cfg_.max_context) {
  DSA_CHECK(cfg_.max_running_requests > 0, "max_running_requests must be positive, got {}",
            cfg_.max_running_requests);
  DSA_CHECK(cfg_.max_prefill_tokens > 0, "max_prefill_tokens must be positive, got {}",
            cfg_.max_prefill_tokens);
}

Scheduler::~Scheduler() = default;

int64_t Scheduler::chunk_cap() const {
  return cfg_.chunked_prefill_size > 0 ? cfg_.chunked_prefill_size : std::numeric_limits<int64_t>::max();
}

int64_t Scheduler::rank(const Request& r) const {
  if (!cfg_.enable_priority) return 0;
  // Negation cannot overflow for the values the API accepts (int32 range); clamp the rest.
  const int64_t p = std::max(r.params.priority, std::numeric_limits<int64_t>::min() + 1);
  return cfg_.low_priority_values_first ? -p : p;
}

void Scheduler::enqueue(Request& r, bool front) {
  if (!cfg_.enable_priority) {
    if (front) {
      waiting_.push_front(&r);
    } else {
      waiting_.push_back(&r);
    }
    return;
  }
  const int64_t k = rank(r);
  auto pos = std::find_if(waiting_.begin(), waiting_.end(), [&](const Request* w) {
    return rank(*w) < k || (rank(*w) == k && w->serial > r.serial);
  });
  waiting_.insert(pos, &r);
}

const Request* Scheduler::find(uint64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

void Scheduler::add(std::unique_ptr<Request> req, std::vector<StepOutput>& out) {
  DSA_CHECK(req != nullptr, "scheduler: null request");
  DSA_CHECK(!requests_.count(req->id), "scheduler: request id {} is already queued", req->id);
  Request& r = *req;
  r.serial = next_serial_++;
  r.prompt_len = int64_t(r.tokens.size());
  requests_.emplace(r.id, std::move(req));
  if (r.tokens.empty()) return finish(r, FinishReason::error, "the prompt is empty", out);
  if (cfg_.max_context > 0 && r.prompt_len >= cfg_.max_context) {
    return finish(
        r, FinishReason::error,
        fmt::format("the prompt has {} tokens, the context length is {}", r.prompt_len, cfg_.max_context),
        out);
  }
  if (r.params.max_new_tokens == 0) return finish(r, FinishReason::length, "", out);
  enqueue(r, false);
}

bool Scheduler::abort(uint64_t id, std::vector<StepOutput>& out) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  finish(*it->second, FinishReason::abort, "", out);
  return true;
}

bool Scheduler::make_room(int64_t pages) {
  if (pages <= 0) return true;
  if (kv_.free_pages() < pages) cache_.evict(pages - kv_.free_pages());
  return kv_.free_pages() >= pages;
}

void Scheduler::release(Request& r) {
  r.spec_hidden = Tensor();
  // A speculative item committed KV for draft tokens that are not (yet) tokens: only KV of tokens is kept.
  if (r.kv.len > int64_t(r.tokens.size())) kv_.rollback(r.kv, int64_t(r.tokens.size()));
  if (!r.kv.pages.empty() || r.prefix_node != RadixCache::kRoot) {
    // The full computed pages go to the prefix cache (which owns them from now on), the rest to the pool.
    const std::vector<int32_t> full = kv_.release(r.kv);
    cache_.insert(std::span<const int32_t>(r.tokens).first(full.size() * size_t(kv_.page_size())), full);
    cache_.unlock(r.prefix_node);
  }
  r.kv = KvSeq();
  r.prefix_node = RadixCache::kRoot;
}

void Scheduler::erase_running(Request* r) {
  running_.erase(std::remove(running_.begin(), running_.end(), r), running_.end());
}

void Scheduler::retract(Request& r) {
  release(r);
  erase_running(&r);
  enqueue(r, true);
  ++r.num_retractions;
  ++num_retractions_;
}

void Scheduler::drop(Request& r) {
  release(r);
  erase_running(&r);
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), &r), waiting_.end());
  requests_.erase(r.id);  // destroys r
}

Request* Scheduler::alive(const ScheduledRequest& s) const {
  auto it = requests_.find(s.id);
  return it != requests_.end() && it->second->serial == s.serial ? it->second.get() : nullptr;
}

void Scheduler::finish(Request& r, FinishReason why, std::string error, std::vector<StepOutput>& out) {
  StepOutput o;
  o.id = r.id;
  o.finish = why;
  o.error = std::move(error);
  o.prompt_tokens = r.prompt_len;
  o.cached_tokens = r.cached_tokens;
  o.completion_tokens = r.num_output();
  out.push_back(std::move(o));
  drop(r);
}

bool Scheduler::admit(Request& r, int64_t budget, ScheduleBatch& b, std::vector<StepOutput>& out) {
  const int64_t ps = kv_.page_size();
  // A request that still reports prompt logprobs computes its whole prompt (cached tokens have no logits).
  RadixCache::Match m =
      cache_.match_prefix(r.tokens, r.wants_prompt_logprobs() ? 0 : int64_t(r.tokens.size()) - 1);
  cache_.lock(m.node);
  // Admit only when the whole remaining input and the first output token fit (with what eviction can
  // free), so that a new request does not immediately push a running one out.
  const int64_t need_all = kv_.pages_for(int64_t(r.tokens.size()) + 1) - int64_t(m.pages.size());
  const int64_t n = std::min({int64_t(r.tokens.size()) - m.num_tokens, chunk_cap(), budget});
  const int64_t need_now = kv_.pages_for(m.num_tokens + n) - int64_t(m.pages.size());
  if (kv_.free_pages() + cache_.evictable_pages() < need_all || !make_room(need_now)) {
    cache_.unlock(m.node);
    if (running_.empty() && b.empty()) {
      // Nothing else holds memory: this request can never fit.
      finish(r, FinishReason::error,
             fmt::format("the request needs {} KV pages of {} tokens, the pool has {}",
                         kv_.pages_for(int64_t(r.tokens.size()) + 1), ps, kv_.num_pages()),
             out);
      return true;  // the queue moved on
    }
    return false;
  }
  waiting_.pop_front();
  kv_.adopt_prefix(r.kv, std::move(m.pages), m.num_tokens);
  r.prefix_node = m.node;
  if (!r.admitted_once) {
    r.cached_tokens = m.num_tokens;
    r.admitted_once = true;
    admitted_prompt_tokens_ += r.prompt_len;
    prefix_hit_tokens_ += m.num_tokens;
  }
  kv_.reserve(r.kv, n);
  // Priority mode: after every running request of the same or higher rank (it is the youngest).
  const int64_t k = rank(r);
  running_.insert(
      std::find_if(running_.begin(), running_.end(), [&](const Request* o) { return rank(*o) < k; }), &r);
  const bool sample = n == r.remaining_input();
  b.items.push_back({&r, r.id, r.serial, r.kv.len, n, sample, false});
  b.num_prefill_tokens += n;
  return true;
}

ScheduleBatch Scheduler::schedule(std::vector<StepOutput>& out) {
  ScheduleBatch b;
  const int64_t ps = kv_.page_size();
  int64_t budget = cfg_.max_prefill_tokens;
  // Running requests, oldest first (priority mode: highest priority first, then oldest).
  for (size_t i = 0; i < running_.size(); ++i) {
    Request* r = running_[i];
    // Its sample in the step in flight reaches the length limit: nothing more to compute.
    if (r->at_length_limit(cfg_.max_context)) continue;
    // Decoding: its one new token is a generated one (a prompt's last chunk of one token is a prefill).
    const bool decode = r->remaining_input() == 1 && r->kv.len >= r->prompt_len;
    int64_t n = decode ? 1 : std::min({r->remaining_input(), chunk_cap(), budget});
    if (n <= 0) continue;
    // Speculation: room for the drafts too when it can be had without retracting (and inside the context);
    // otherwise a plain decode this step.
    const int64_t N = cfg_.speculative_num_steps;
    if (decode && N > 0 && r->speculate && r->spec_hidden.defined() &&
        (cfg_.max_context <= 0 || int64_t(r->tokens.size()) + N <= cfg_.max_context) &&
        make_room(kv_.pages_needed(r->kv, 1 + N))) {
      kv_.reserve(r->kv, 1 + N);
      ScheduledRequest it{r, r->id, r->serial, r->kv.len, 1, true, true};
      it.drafts = N;
      b.items.push_back(it);
      ++b.num_decode;
      continue;
    }
    bool retracted_self = false;
    for (;;) {
      const int64_t need = kv_.pages_needed(r->kv, n);
      if (make_room(need)) break;
      if (!decode) {  // shrink the chunk to the pages that can be had
        const int64_t have = (int64_t(r->kv.pages.size()) + kv_.free_pages()) * ps - r->kv.len;
        if (have >= 1 && have < n) {
          n = have;
          continue;
        }
      }
      Request* victim = running_.back();
      if (victim == r && running_.size() == 1) {
        finish(*r, FinishReason::error,
               fmt::format("the request needs more than the {} KV pages of the pool", kv_.num_pages()), out);
        retracted_self = true;
        break;
      }
      retract(*victim);
      if (victim == r) {
        retracted_self = true;
        break;
      }
    }
    if (retracted_self) break;  // r was the youngest: nothing after it
    kv_.reserve(r->kv, n);
    b.items.push_back({r, r->id, r->serial, r->kv.len, n, n == r->remaining_input(), decode});
    if (decode) {
      ++b.num_decode;
    } else {
      b.num_prefill_tokens += n;
      budget -= n;
    }
  }
  // The prefill adder: waiting requests in queue order (FCFS, or by priority).
  while (!waiting_.empty() && int64_t(running_.size()) < cfg_.max_running_requests && budget > 0) {
    Request& r = *waiting_.front();
    const int64_t before = b.num_prefill_tokens;
    if (!admit(r, budget, b, out)) break;
    budget -= b.num_prefill_tokens - before;
  }
  // Prompt logprobs: the rows of this chunk's positions that predict a prompt token not reported yet.
  for (ScheduledRequest& s : b.items) {
    const Request& r = *s.req;
    if (!r.wants_prompt_logprobs()) continue;
    const int64_t from = std::max(s.start, r.prompt_logprobs_next - 1);
    const int64_t to = std::min(s.start + s.num_new, r.prompt_len - 1);
    s.logprob_from = from;
    s.logprob_rows = std::max<int64_t>(0, to - from);
  }
  return b;
}

model::ForwardBatch Scheduler::build_forward(const ScheduleBatch& batch) const {
  model::ForwardBatch fb;
  fb.page_size = kv_.page_size();
  for (const ScheduledRequest& s : batch.items) {
    const Request& r = *s.req;
    DSA_CHECK(r.kv.len == s.start, "scheduler: request {} moved since it was scheduled", r.id);
    const int64_t base = fb.num_tokens();
    fb.add_request(std::span<const int32_t>(r.tokens).subspan(size_t(r.kv.len), size_t(s.num_new)), r.kv.len,
                   r.kv.pages, s.decode);
    for (int64_t q = 0; q < s.logprob_rows; ++q)
      fb.extra_logit_rows.push_back(int32_t(base + s.logprob_from - s.start + q));
  }
  return fb;
}

int64_t Scheduler::num_prompt_logprob_rows(const ScheduleBatch& batch) {
  int64_t n = 0;
  for (const ScheduledRequest& s : batch.items) n += s.logprob_rows;
  return n;
}

void Scheduler::process_prompt_logprobs(const ScheduleBatch& batch, std::span<const float> rows,
                                        int64_t vocab, std::vector<StepOutput>& out) {
  DSA_CHECK(int64_t(rows.size()) == num_prompt_logprob_rows(batch) * vocab,
            "scheduler: {} prompt logprob values for {} rows of vocab {}", rows.size(),
            num_prompt_logprob_rows(batch), vocab);
  int64_t row = 0;
  for (const ScheduledRequest& s : batch.items) {
    Request* r = s.logprob_rows > 0 ? alive(s) : nullptr;
    if (r != nullptr) {
      StepOutput o;
      o.id = r->id;
      for (int64_t q = s.logprob_from; q < s.logprob_from + s.logprob_rows; ++q) {
        if (q + 1 < r->prompt_logprobs_next) continue;  // reported before (a recomputation)
        if (o.prompt_logprobs.empty()) o.prompt_logprobs_from = q + 1;
        o.prompt_logprobs.push_back(
            token_logprobs(rows.subspan(size_t((row + q - s.logprob_from) * vocab), size_t(vocab)),
                           r->tokens[size_t(q + 1)], r->params.prompt_logprobs));
        r->prompt_logprobs_next = q + 2;
      }
      if (!o.prompt_logprobs.empty()) out.push_back(std::move(o));
    }
    row += s.logprob_rows;
  }
}

void Scheduler::commit(const ScheduleBatch& batch) {
  for (const ScheduledRequest& s : batch.items) {
    Request& r = *s.req;
    DSA_CHECK(r.kv.len == s.start, "scheduler: request {} moved since it was scheduled", r.id);
    if (s.drafts > 0) {  // the pending token and the drafts; the verdict adds the tokens
      kv_.commit(r.kv, 1 + s.drafts);
      continue;
    }
    kv_.commit(r.kv, s.num_new);
    if (s.sample) {
      DSA_CHECK(r.kv.len == int64_t(r.tokens.size()), "scheduler: request {} samples before its input ends",
                r.id);
      r.tokens.push_back(kFutureToken);
    }
  }
}

bool Scheduler::prune(ScheduleBatch& batch) const {
  const size_t before = batch.items.size();
  std::erase_if(batch.items, [&](const ScheduledRequest& s) { return alive(s) == nullptr; });
  if (batch.items.size() == before) return false;
  batch.num_prefill_tokens = 0;
  batch.num_decode = 0;
  for (const ScheduledRequest& s : batch.items) {
    if (s.decode) {
      ++batch.num_decode;
    } else {
      batch.num_prefill_tokens += s.num_new;
    }
  }
  return true;
}

void Scheduler::fail(const ScheduleBatch& batch, const std::string& error, std::vector<StepOutput>& out) {
  for (const ScheduledRequest& s : batch.items) {
    Request* r = alive(s);
    if (r == nullptr) continue;
    // This step's KV: never written.
    if (r->kv.len == s.start + s.num_new + s.drafts) kv_.rollback(r->kv, s.start);
    finish(*r, FinishReason::error, fmt::format("model step failed: {}", error), out);
  }
}

void Scheduler::resolve(const ScheduleBatch& batch, model::ForwardBatch& fb) const {
  DSA_CHECK(fb.num_requests() == int64_t(batch.items.size()), "scheduler: {} forward requests for {} items",
            fb.num_requests(), batch.items.size());
  for (size_t k = 0; k < batch.items.size(); ++k) {
    const ScheduledRequest& s = batch.items[k];
    const int64_t b = fb.token_begin[k];
    for (int64_t j = 0; j < s.num_new; ++j) {
      int32_t& id = fb.input_ids[size_t(b + j)];
      if (id != kFutureToken) continue;
      id = s.req->tokens[size_t(s.start + j)];
      DSA_CHECK(id != kFutureToken, "scheduler: request {} input token {} was never sampled", s.req->id,
                s.start + j);
    }
  }
}

Request* Scheduler::sampling_request(const ScheduleBatch& batch, size_t k) const {
  DSA_CHECK(k < batch.items.size(), "scheduler: item {} of {}", k, batch.items.size());
  return batch.items[k].sample ? alive(batch.items[k]) : nullptr;
}

void Scheduler::process(const ScheduleBatch& batch, std::span<const float> logits, int64_t vocab,
                        std::vector<StepOutput>& out) {
  DSA_CHECK(int64_t(logits.size()) == int64_t(batch.items.size()) * vocab,
            "scheduler: {} logits for {} requests of vocab {}", logits.size(), batch.items.size(), vocab);
  sample_rows(batch, logits, vocab, sample_results_, sample_rows_);
  process(batch, sample_rows_, out);
}

void Scheduler::sample_rows(const ScheduleBatch& batch, std::span<const float> logits, int64_t vocab,
                            std::vector<SampleResult>& results, std::vector<SampleRow>& rows) {
  DSA_CHECK(int64_t(logits.size()) == int64_t(batch.items.size()) * vocab,
            "scheduler: {} logits for {} requests of vocab {}", logits.size(), batch.items.size(), vocab);
  const size_t n = batch.items.size();
  results.resize(n);
  rows.assign(n, SampleRow{});
  // The rows to sample here: each reads only its request's params and sampler state, so they are drawn
  // in parallel (per-thread scratch) with the tokens of a sequential pass.
  sample_reqs_.assign(n, nullptr);
  for (size_t k = 0; k < n; ++k) {
    rows[k].logits = logits.subspan(k * size_t(vocab), size_t(vocab));
    Request* r = sampling_request(batch, k);
    if (r != nullptr && r->params.constraint == nullptr) sample_reqs_[k] = r;
  }
  std::vector<std::exception_ptr> errors(n);
  // About 16K logits per task (a temperature row of 1,024 costs ~5 us of exponentials): small
  // vocabularies batch rows, a real one (154,880) samples a row per task.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, vocab));
  parallel_for(int64_t(n), grain, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> scratch;
    for (int64_t k = b; k < e; ++k) {
      Request* r = sample_reqs_[size_t(k)];
      if (r == nullptr) continue;
      try {
        results[size_t(k)] = sample(rows[size_t(k)].logits, r->params, r->sampler, scratch);
      } catch (...) {
        errors[size_t(k)] = std::current_exception();
      }
    }
  });
  for (size_t k = 0; k < n; ++k) {
    if (errors[k]) std::rethrow_exception(errors[k]);
    if (sample_reqs_[k] != nullptr) rows[k].sampled = &results[k];
  }
}

void Scheduler::process(const ScheduleBatch& batch, std::span<const SampleRow> rows,
                        std::vector<StepOutput>& out) {
  DSA_CHECK(rows.size() == batch.items.size(), "scheduler: {} sample rows for {} requests", rows.size(),
            batch.items.size());
  for (size_t k = 0; k < batch.items.size(); ++k) {
    const ScheduledRequest& s = batch.items[k];
    if (!s.sample || s.drafts > 0) continue;
    Request* rp = alive(s);
    if (rp == nullptr) continue;  // aborted or failed while the step ran
    Request& r = *rp;
    const size_t slot = size_t(s.start + s.num_new);
    DSA_CHECK(slot + 1 == r.tokens.size() && r.tokens[slot] == kFutureToken,
              "scheduler: request {} has no future token at {} (batch not committed?)", r.id, slot);
    DSA_CHECK(rows[k].sampled == nullptr || r.params.constraint == nullptr,
              "scheduler: request {} has a constraint but was sampled outside the scheduler", r.id);
    SampleResult res;
    if (rows[k].sampled != nullptr) {
      res = *rows[k].sampled;
    } else if (r.params.constraint != nullptr) {
      // Sampled under the grammar's mask; a grammar that cannot continue fails its request only.
      try {
        res = sample(rows[k].logits, r.params, r.sampler, scratch_, r.params.constraint.get());
      } catch (const std::exception& e) {
        finish(r, FinishReason::error, e.what(), out);
        continue;
      }
    } else {
      res = sample(rows[k].logits, r.params, r.sampler, scratch_);
    }
    const OutputProcessor::Result done = output_.process(r, std::span<SampleResult>(&res, 1), out);
    if (done.finish == FinishReason::error) {
      finish(r, FinishReason::error, done.error, out);
    } else if (done.finish != FinishReason::none) {
      drop(r);
    }
  }
}

void Scheduler::accept_drafts(const ScheduledRequest& s, std::span<const int32_t> run,
                              std::vector<StepOutput>& out) {
  std::vector<SampleResult> res(run.size());
  for (size_t i = 0; i < run.size(); ++i) res[i].token = run[i];
  accept_drafts(s, res, out);
}

void Scheduler::accept_drafts(const ScheduledRequest& s, std::span<SampleResult> results,
                              std::vector<StepOutput>& out) {
  Request* rp = alive(s);
  if (rp == nullptr) return;
  Request& r = *rp;
  const int64_t j = int64_t(results.size()) - 1;
  DSA_CHECK(s.drafts > 0 && j >= 0 && j <= s.drafts && r.kv.len == s.start + 1 + s.drafts &&
                int64_t(r.tokens.size()) == s.start + 1,
            "scheduler: request {}: a verdict of {} tokens for {} drafts", r.id, results.size(), s.drafts);
  // The pending token and the accepted drafts keep their KV.
  kv_.rollback(r.kv, s.start + 1 + j);
  r.tokens.push_back(kFutureToken);
  r.spec_verify_ct += 1;
  r.spec_accepted_drafts += j;
  const OutputProcessor::Result done = output_.process(r, results, out);
  if (done.finish == FinishReason::error) {
    finish(r, FinishReason::error, done.error, out);
  } else if (done.finish != FinishReason::none) {
    drop(r);  // release() cuts the KV back to the kept tokens
  }
}

void Scheduler::check_integrity() const {
  kv_.check_pool();
  cache_.check_integrity();
  DSA_CHECK(int64_t(running_.size()) <= cfg_.max_running_requests, "scheduler: {} running > max {}",
            running_.size(), cfg_.max_running_requests);
  DSA_CHECK(running_.size() + waiting_.size() == requests_.size(),
            "scheduler: {} running + {} waiting != {} known", running_.size(), waiting_.size(),
            requests_.size());
  for (size_t i = 1; i < running_.size(); ++i) {
    DSA_CHECK(rank(*running_[i - 1]) >= rank(*running_[i]),
              "scheduler: running request {} (rank {}) is before {} of higher rank", running_[i - 1]->id,
              rank(*running_[i - 1]), running_[i]->id);
  }
  if (cfg_.enable_priority) {
    for (size_t i = 1; i < waiting_.size(); ++i) {
      const Request& a = *waiting_[i - 1];
      const Request& b = *waiting_[i];
      DSA_CHECK(rank(a) > rank(b) || (rank(a) == rank(b) && a.serial < b.serial),
                "scheduler: waiting request {} is queued before {} out of priority/arrival order", a.id,
                b.id);
    }
  }
  std::unordered_set<int32_t> own;
  for (const Request* r : waiting_) {
    DSA_CHECK(r->kv.empty() && r->prefix_node == RadixCache::kRoot,
              "scheduler: waiting request {} holds KV pages", r->id);
  }
  for (const Request* r : running_) {
    DSA_CHECK(r->kv.len < int64_t(r->tokens.size()), "scheduler: request {} has KV for all its tokens",
              r->id);
    kv_.check(r->kv);
    for (size_t i = 0; i < r->kv.pages.size(); ++i) {
      const int32_t p = r->kv.pages[i];
      if (int64_t(i) < r->kv.prefix_pages) {
        DSA_CHECK(cache_.holds_page(p), "scheduler: prefix page {} of request {} is not in the cache", p,
                  r->id);
      } else {
        DSA_CHECK(!cache_.holds_page(p), "scheduler: page {} of request {} is also in the cache", p, r->id);
        DSA_CHECK(own.insert(p).second, "scheduler: page {} is held by two requests", p);
      }
    }
  }
  const int64_t used = kv_.num_pages() - kv_.free_pages();
  DSA_CHECK(used == cache_.cached_pages() + int64_t(own.size()),
            "scheduler: {} pages used, but the cache holds {} and requests {} (leak)", used,
            cache_.cached_pages(), own.size());
  DSA_CHECK(kv_.held_pages() == int64_t(own.size()),
            "scheduler: the KV manager counts {} held pages, requests {}", kv_.held_pages(), own.size());
}

}  // namespace dsaserve::runtime
