#include "runtime/ranks/dp.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "model/step_plan.h"
#include "runtime/ranks/leader.h"
#include "runtime/ranks/wire.h"
#include "trace/trace.h"

namespace dsaserve::runtime {

namespace {

using wire::Reader;
using wire::Writer;

constexpr int64_t kMagic = 0x647361647072;  // "dsadpr": a round header that is not ours fails loudly
// A round's header per leader: magic, round, tokens, decode (or none), stop, payload bytes.
constexpr int64_t kHead = 6;
constexpr std::chrono::milliseconds kPollMin{1}, kPollMax{16};

// Every field travels: a field added to these structs must be added here (the sizes say so).
static_assert(sizeof(SamplingParams) == 152, "SamplingParams changed: update put_params / get_params");
static_assert(sizeof(StepOutput) == 152, "StepOutput changed: update put_output / get_output");

void put_params(Writer& w, const SamplingParams& p) {
  DSA_CHECK(p.constraint == nullptr, "ranks: a grammar-constrained request cannot travel to another rank");
  w.put(p.temperature);
  w.put(p.top_p);
  w.put(p.top_k);
  w.put(p.min_p);
  w.put(p.presence_penalty);
  w.put(p.frequency_penalty);
  w.put(p.repetition_penalty);
  std::vector<int32_t> bias_ids;
  std::vector<float> bias;
  for (const auto& [id, b] : p.logit_bias) {
    bias_ids.push_back(id);
    bias.push_back(b);
  }
  w.put_vec(bias_ids);
  w.put_vec(bias);
  w.put<uint8_t>(p.seed.has_value());
  w.put<uint64_t>(p.seed.value_or(0));
  w.put<uint8_t>(p.logprobs);
  w.put(p.top_logprobs);
  w.put(p.prompt_logprobs);
  w.put(p.max_new_tokens);
  w.put_vec(p.stop_token_ids);
  w.put<uint8_t>(p.ignore_eos);
  w.put(p.priority);
}

SamplingParams get_params(Reader& r) {
  SamplingParams p;
  p.temperature = r.get<float>();
  p.top_p = r.get<float>();
  p.top_k = r.get<int32_t>();
  p.min_p = r.get<float>();
  p.presence_penalty = r.get<float>();
  p.frequency_penalty = r.get<float>();
  p.repetition_penalty = r.get<float>();
  const auto bias_ids = r.get_vec<int32_t>();
  const auto bias = r.get_vec<float>();
  DSA_CHECK(bias_ids.size() == bias.size(), "ranks message: {} logit bias ids, {} values", bias_ids.size(),
            bias.size());
  for (size_t i = 0; i < bias.size(); ++i) p.logit_bias.emplace_back(bias_ids[i], bias[i]);
  const bool seeded = r.get<uint8_t>() != 0;
  const auto seed = r.get<uint64_t>();
  if (seeded) p.seed = seed;
  p.logprobs = r.get<uint8_t>() != 0;
  p.top_logprobs = r.get<int32_t>();
  p.prompt_logprobs = r.get<int32_t>();
  p.max_new_tokens = r.get<int64_t>();
  p.stop_token_ids = r.get_vec<int32_t>();
  p.ignore_eos = r.get<uint8_t>() != 0;
  p.priority = r.get<int64_t>();
  return p;
}

void put_output(Writer& w, const StepOutput& o) {
  w.put(o.id);
  w.put(o.token);
  w.put(o.logprob);
  w.put_vec(o.top_logprobs);
  w.put<uint64_t>(o.prompt_logprobs.size());
  for (const SampleResult& s : o.prompt_logprobs) {
    w.put(s.token);
    w.put(s.logprob);
    w.put_vec(s.top);
  }
  w.put(o.prompt_logprobs_from);
  w.put(o.finish);
  w.put_str(o.error);
  w.put(o.prompt_tokens);
  w.put(o.cached_tokens);
  w.put(o.completion_tokens);
  w.put(o.spec_verify_ct);
  w.put(o.spec_accepted_drafts);
}

StepOutput get_output(Reader& r) {
  StepOutput o;
  o.id = r.get<uint64_t>();
  o.token = r.get<int32_t>();
  o.logprob = r.get<float>();
  o.top_logprobs = r.get_vec<TokenLogprob>();
  const auto n = r.get<uint64_t>();
  DSA_CHECK(n <= r.remaining(), "ranks message: {} prompt logprobs past its end", n);
  o.prompt_logprobs.resize(size_t(n));
  for (SampleResult& s : o.prompt_logprobs) {
    s.token = r.get<int32_t>();
    s.logprob = r.get<float>();
    s.top = r.get_vec<TokenLogprob>();
  }
  o.prompt_logprobs_from = r.get<int64_t>();
  const auto finish = r.get<uint8_t>();
  DSA_CHECK(finish <= uint8_t(FinishReason::error), "ranks message: finish reason {}", finish);
  o.finish = FinishReason(finish);
  o.error = r.get_str();
  o.prompt_tokens = r.get<int64_t>();
  o.cached_tokens = r.get<int64_t>();
  o.completion_tokens = r.get<int64_t>();
  o.spec_verify_ct = r.get<int64_t>();
  o.spec_accepted_drafts = r.get<int64_t>();
  return o;
}

// EngineStats's numbers, in declaration order (the counts, then the seconds).
void put_stats(Writer& w, const EngineStats& s) {
  for (int64_t v : {s.num_waiting, s.num_running, s.kv_pages_total, s.kv_pages_free, s.prefix_cache_pages,
                    s.steps, s.prompt_tokens, s.prefix_hit_tokens, s.prefill_tokens, s.generated_tokens,
                    s.retractions, s.last_batch_size, s.cuda_graphs, s.cuda_graph_replays, s.spec_rounds,
                    s.spec_drafted_tokens, s.spec_accepted_tokens})
    w.put(v);
  for (double v : {s.busy_seconds, s.schedule_seconds, s.launch_gap_seconds, s.cuda_graph_seconds}) w.put(v);
  w.put_vec(s.spec_accept_length_hist);
}

EngineStats get_stats(Reader& r) {
  EngineStats s;
  for (int64_t* v :
       {&s.num_waiting, &s.num_running, &s.kv_pages_total, &s.kv_pages_free, &s.prefix_cache_pages, &s.steps,
        &s.prompt_tokens, &s.prefix_hit_tokens, &s.prefill_tokens, &s.generated_tokens, &s.retractions,
        &s.last_batch_size, &s.cuda_graphs, &s.cuda_graph_replays, &s.spec_rounds, &s.spec_drafted_tokens,
        &s.spec_accepted_tokens})
    *v = r.get<int64_t>();
  for (double* v : {&s.busy_seconds, &s.schedule_seconds, &s.launch_gap_seconds, &s.cuda_graph_seconds})
    *v = r.get<double>();
  s.spec_accept_length_hist = r.get_vec<int64_t>();
  return s;
}

// Whether a leader's stats changed enough to send (the gauges /metrics shows, and the counters).
bool stats_differ(const EngineStats& a, const EngineStats& b) {
  return a.num_waiting != b.num_waiting || a.num_running != b.num_running ||
         a.kv_pages_free != b.kv_pages_free || a.prefix_cache_pages != b.prefix_cache_pages ||
         a.steps != b.steps || a.generated_tokens != b.generated_tokens ||
         a.prompt_tokens != b.prompt_tokens || a.last_batch_size != b.last_batch_size;
}

}  // namespace

std::vector<uint8_t> encode_outputs(const std::vector<StepOutput>& outs, const EngineStats& stats) {
  Writer w;
  put_stats(w, stats);
  w.put<uint64_t>(outs.size());
  for (const StepOutput& o : outs) put_output(w, o);
  return w.take();
}

void decode_outputs(const uint8_t* data, size_t size, std::vector<StepOutput>& outs, EngineStats& stats) {
  Reader r(data, size);
  stats = get_stats(r);
  const auto n = r.get<uint64_t>();
  DSA_CHECK(n <= r.remaining(), "ranks message: {} outputs past its end", n);
  for (uint64_t i = 0; i < n; ++i) outs.push_back(get_output(r));
  r.done();
}

std::vector<uint8_t> encode_routed(const std::vector<DpRouted>& submits,
                                   const std::vector<std::pair<int64_t, uint64_t>>& aborts) {
  Writer w;
  w.put<uint64_t>(submits.size());
  for (const DpRouted& s : submits) {
    w.put(s.group);
    w.put(s.req.id);
    w.put_vec(s.req.prompt);
    put_params(w, s.req.params);
  }
  std::vector<int64_t> groups;
  std::vector<uint64_t> ids;
  for (const auto& [g, id] : aborts) {
    groups.push_back(g);
    ids.push_back(id);
  }
  w.put_vec(groups);
  w.put_vec(ids);
  return w.take();
}

void decode_routed(const uint8_t* data, size_t size, std::vector<DpRouted>& submits,
                   std::vector<std::pair<int64_t, uint64_t>>& aborts) {
  Reader r(data, size);
  const auto n = r.get<uint64_t>();
  DSA_CHECK(n <= r.remaining(), "ranks message: {} requests past its end", n);
  for (uint64_t i = 0; i < n; ++i) {
    DpRouted s;
    s.group = r.get<int64_t>();
    s.req.id = r.get<uint64_t>();
    s.req.prompt = r.get_vec<int32_t>();
    s.req.params = get_params(r);
    submits.push_back(std::move(s));
  }
  const auto groups = r.get_vec<int64_t>();
  const auto ids = r.get_vec<uint64_t>();
  DSA_CHECK(groups.size() == ids.size(), "ranks message: {} abort groups, {} ids", groups.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) aborts.emplace_back(groups[i], ids[i]);
  r.done();
}

std::vector<uint8_t> encode_engine_config(const EngineConfig& cfg) {
  Writer w;
  const SchedulerConfig& s = cfg.scheduler;
  w.put(s.max_running_requests);
  w.put(s.max_prefill_tokens);
  w.put(s.chunked_prefill_size);
  w.put(s.max_context);
  w.put_vec(s.eos_token_ids);
  w.put<uint8_t>(s.enable_priority);
  w.put<uint8_t>(s.low_priority_values_first);
  w.put<uint8_t>(cfg.enable_prefix_cache);
  w.put<uint8_t>(cfg.check_integrity);
  w.put<uint8_t>(cfg.overlap_schedule);
  w.put_vec(encode_init(StepInit::of(cfg.kv_pages, cfg.page_size, false, cfg.kv_dtype, cfg.forward)));
  return w.take();
}

EngineConfig decode_engine_config(const std::vector<uint8_t>& bytes) {
  Reader r(bytes);
  EngineConfig cfg;
  SchedulerConfig& s = cfg.scheduler;
  s.max_running_requests = r.get<int64_t>();
  s.max_prefill_tokens = r.get<int64_t>();
  s.chunked_prefill_size = r.get<int64_t>();
  s.max_context = r.get<int64_t>();
  s.eos_token_ids = r.get_vec<int32_t>();
  s.enable_priority = r.get<uint8_t>() != 0;
  s.low_priority_values_first = r.get<uint8_t>() != 0;
  cfg.enable_prefix_cache = r.get<uint8_t>() != 0;
  cfg.check_integrity = r.get<uint8_t>() != 0;
  cfg.overlap_schedule = r.get<uint8_t>() != 0;
  const StepInit init = decode_init(r.get_vec<uint8_t>());
  r.done();
  cfg.kv_pages = init.num_pages;
  cfg.page_size = init.page_size;
  cfg.kv_dtype = init.kv_dtype;
  cfg.forward = init.forward(nullptr);
  return cfg;
}

// ---------------------------------------------------------------------------------------------------------

DpLink::DpLink(std::shared_ptr<const model::Model> model, std::shared_ptr<Ranks> ranks)
    : model_(std::move(model)), ranks_(std::move(ranks)) {
  DSA_CHECK(model_ != nullptr && ranks_ != nullptr, "ranks: a DP link needs a model and its ranks");
  DSA_CHECK(ranks_->dp_size() > 1 && ranks_->leader(),
            "ranks: rank {} is not a DP group's leader of an attention DP layout ({})", ranks_->rank(),
            ranks_->layout().describe());
  beat_ = beat_interval(ranks_->timeout());
}

DpLink::~DpLink() {
  if (!thread_.joinable()) return;
  if (ranks_->front()) {
    stop();
    return;
  }
  // A leader that gives up before the front ended the rounds (its set-up failed): the deployment
  // cannot go on without it.
  std::fprintf(stderr,
               "error: rank %lld (DP group %lld's leader) stopped before the front: ending this rank\n",
               static_cast<long long>(ranks_->rank()), static_cast<long long>(ranks_->dp_rank()));
  std::fflush(stderr);
  std::_Exit(1);
}

void DpLink::send_engine_config(const EngineConfig& cfg) {
  DSA_CHECK(ranks_->front(), "ranks: only the front sends the engine settings");
  const std::vector<uint8_t> bytes = encode_engine_config(cfg);
  Tensor n = Tensor::empty({1}, DType::i64);
  n.data<int64_t>()[0] = int64_t(bytes.size());
  ranks_->dp_control().broadcast(n, 0, "dp_engine_config_broadcast");
  Tensor body = Tensor::empty({int64_t(bytes.size())}, DType::u8);
  std::memcpy(body.raw_data(), bytes.data(), bytes.size());
  ranks_->dp_control().broadcast(body, 0, "dp_engine_config_broadcast");
}

EngineConfig DpLink::receive_engine_config() {
  DSA_CHECK(!ranks_->front(), "ranks: the front sends the engine settings");
  Tensor n = Tensor::empty({1}, DType::i64);
  ranks_->dp_control().broadcast(n, 0, "dp_engine_config_broadcast");
  const int64_t size = n.data<int64_t>()[0];
  DSA_CHECK(size > 0 && size < (int64_t(1) << 24), "ranks: engine settings of {} bytes", size);
  Tensor body = Tensor::empty({size}, DType::u8);
  ranks_->dp_control().broadcast(body, 0, "dp_engine_config_broadcast");
  const auto* p = static_cast<const uint8_t*>(body.raw_data());
  return decode_engine_config(std::vector<uint8_t>(p, p + size));
}

void DpLink::attach(model::KvCache& cache, const StepInit& init) {
  DSA_CHECK(cache_ == nullptr, "ranks: the DP link already serves an engine");
  cache_ = &cache;
  opt_ = init.forward(&ranks_->groups());
  StepMessage m;
  m.kind = StepKind::init;
  m.init = init;
  send_followers(std::move(m));
  thread_ = std::thread([this] { rounds(); });
}

void DpLink::launch(model::ForwardBatch fb) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    DSA_CHECK(!pending_ && !running_batch_, "ranks: a step is already in flight");
    pending_ = std::move(fb);
    idle_ = false;
  }
  cv_.notify_all();
}

Tensor DpLink::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return batch_done_ || stopped_; });
  if (batch_done_) {
    batch_done_ = false;
    return std::move(result_);
  }
  pending_.reset();
  fail("ranks: the deployment is stopping (DP group {})", ranks_->dp_rank());
}

void DpLink::engine_idle() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    idle_ = true;
  }
  cv_.notify_all();
}

void DpLink::serve(Engine* engine) {
  DSA_CHECK(!ranks_->front(), "ranks: the front's engine takes its requests from the front");
  std::vector<DpRouted> in;
  std::vector<uint64_t> aborts;
  {
    std::lock_guard<std::mutex> lk(mu_);
    engine_ = engine;
    in.swap(inbox_);
    aborts.swap(inbox_aborts_);
    if (!in.empty()) idle_ = false;
  }
  for (DpRouted& r : in) engine->submit(std::move(r.req));
  for (uint64_t id : aborts) engine->abort(id);
}

void DpLink::route(DpRouted r) {
  DSA_CHECK(r.group > 0 && r.group < ranks_->dp_size(), "ranks: no DP group {} to route to", r.group);
  {
    std::lock_guard<std::mutex> lk(mu_);
    outbox_.push_back(std::move(r));
  }
  cv_.notify_all();
}

void DpLink::route_abort(int64_t group, uint64_t id) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    outbox_aborts_.emplace_back(group, id);
  }
  cv_.notify_all();
}

void DpLink::on_outputs(std::function<void(int64_t, std::vector<StepOutput>&, const EngineStats&)> f) {
  std::lock_guard<std::mutex> lk(mu_);
  on_outputs_ = std::move(f);
}

void DpLink::stop() {
  DSA_CHECK(ranks_->front(), "ranks: only the front stops the DP groups");
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_requested_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DpLink::wait_stopped() {
  if (thread_.joinable()) thread_.join();
}

bool DpLink::stopped() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stopped_;
}

void DpLink::die(const char* what, const std::exception& e) const {
  std::fflush(stdout);
  std::fprintf(stderr, "error: rank %lld (DP group %lld's leader) of %lld: %s failed: %s; ending this rank\n",
               static_cast<long long>(ranks_->rank()), static_cast<long long>(ranks_->dp_rank()),
               static_cast<long long>(ranks_->world_size()), what, e.what());
  std::fflush(stderr);
  std::_Exit(1);
}

void DpLink::send_followers(StepMessage m) {
  if (ranks_->layout().attn_tp() == 1) return;  // a DP group of one rank
  m.seq = follower_seq_++;
  send_step_message(ranks_->control(), m);
  follower_last_ = std::chrono::steady_clock::now();
}

void DpLink::rounds() {
  bool active = true;
  try {
    for (int64_t seq = 0; round(seq, active); ++seq) {
    }
  } catch (const std::exception& e) {
    die("a round of the DP groups", e);
  }
}

bool DpLink::round(int64_t seq, bool& active) {
  const bool front = ranks_->front();
  const int64_t D = ranks_->dp_size();
  std::optional<model::ForwardBatch> mine;
  std::vector<uint8_t> payload;
  std::vector<StepOutput> outs;
  Engine* engine = nullptr;
  bool stop = false;
  {
    std::unique_lock<std::mutex> lk(mu_);
    engine = engine_;
    auto go = [&] {
      return pending_.has_value() || stop_requested_ || !outbox_.empty() || !outbox_aborts_.empty();
    };
    // An engine with work but no batch yet: its batch is coming (at most a beat later, nothing).
    if (!go() && !idle_) cv_.wait_for(lk, beat_, [&] { return go() || idle_; });
    if (!go() && idle_ && !active) {
      // Nothing ran last round and nothing here: poll, backing off while the deployment is idle.
      if (engine != nullptr) {
        lk.unlock();
        engine->wait_outputs(outs, std::chrono::milliseconds(0));
        lk.lock();
      }
      if (outs.empty()) {
        cv_.wait_for(lk, poll_, [&] { return go() || !idle_; });
        poll_ = std::min(poll_ * 2, kPollMax);
      }
    } else {
      poll_ = kPollMin;
    }
    if (pending_) {
      mine = std::move(pending_);
      pending_.reset();
      running_batch_ = true;
    }
    stop = stop_requested_;
    if (front && (!outbox_.empty() || !outbox_aborts_.empty())) {
      payload = encode_routed(outbox_, outbox_aborts_);
      outbox_.clear();
      outbox_aborts_.clear();
    }
  }
  if (!front && engine != nullptr) {
    engine->wait_outputs(outs, std::chrono::milliseconds(0));
    const EngineStats st = engine->stats();
    if (!outs.empty() || !stats_sent_ || stats_differ(st, sent_stats_)) {
      payload = encode_outputs(outs, st);
      sent_stats_ = st;
      stats_sent_ = true;
    }
  }

  // The header, every leader's.
  dist::Communicator& dpc = ranks_->dp_control();
  Tensor head = Tensor::empty({1, kHead}, DType::i64), all = Tensor::empty({D, kHead}, DType::i64);
  int64_t* h = head.data<int64_t>();
  h[0] = kMagic;
  h[1] = seq;
  h[2] = mine ? mine->num_tokens() : 0;
  h[3] = mine && model::step_kind(*mine) == model::StepKind::decode ? 1 : 0;
  h[4] = stop ? 1 : 0;
  h[5] = int64_t(payload.size());
  dpc.all_gather(head, all, "dp_round_all_gather");
  const int64_t* a = all.data<int64_t>();
  std::vector<int64_t> tokens(static_cast<size_t>(D)), bytes(static_cast<size_t>(D));
  bool any_stop = false, decode = true, any_tokens = false;
  int64_t total = 0;
  for (int64_t d = 0; d < D; ++d) {
    const int64_t* x = a + d * kHead;
    DSA_CHECK(x[0] == kMagic && x[1] == seq,
              "ranks: DP group {}'s leader is at round {} (magic {:x}), rank {} at {}", d, x[1], x[0],
              ranks_->rank(), seq);
    DSA_CHECK(x[2] >= 0 && x[5] >= 0, "ranks: DP group {}: {} tokens, {} payload bytes", d, x[2], x[5]);
    tokens[size_t(d)] = x[2];
    decode = decode && (x[3] != 0 || x[2] == 0);
    any_tokens = any_tokens || x[2] > 0;
    any_stop = any_stop || x[4] != 0;
    bytes[size_t(d)] = x[5];
    total += x[5];
  }

  // The payloads: the front's requests for the groups, the groups' outputs for the front.
  if (total > 0) {
    Tensor in = Tensor::empty({int64_t(payload.size())}, DType::u8), out = Tensor::empty({total}, DType::u8);
    if (!payload.empty()) std::memcpy(in.raw_data(), payload.data(), payload.size());
    dpc.all_gather_v(in, out, bytes, "dp_payload_all_gather");
    const auto* p = static_cast<const uint8_t*>(out.raw_data());
    std::vector<size_t> at(static_cast<size_t>(D) + 1, 0);
    for (int64_t d = 0; d < D; ++d) at[size_t(d) + 1] = at[size_t(d)] + size_t(bytes[size_t(d)]);
    if (front) {
      std::function<void(int64_t, std::vector<StepOutput>&, const EngineStats&)> hook;
      {
        std::lock_guard<std::mutex> lk(mu_);
        hook = on_outputs_;
      }
      for (int64_t d = 1; d < D; ++d) {
        if (bytes[size_t(d)] == 0) continue;
        std::vector<StepOutput> got;
        EngineStats st;
        decode_outputs(p + at[size_t(d)], size_t(bytes[size_t(d)]), got, st);
        if (hook) hook(d, got, st);
      }
    } else if (bytes[0] > 0) {
      std::vector<DpRouted> submits;
      std::vector<std::pair<int64_t, uint64_t>> aborts;
      decode_routed(p, size_t(bytes[0]), submits, aborts);
      const int64_t me = ranks_->dp_rank();
      std::vector<DpRouted> mine_in;
      std::vector<uint64_t> mine_aborts;
      for (DpRouted& s : submits)
        if (s.group == me) mine_in.push_back(std::move(s));
      for (const auto& [g, id] : aborts)
        if (g == me) mine_aborts.push_back(id);
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (!mine_in.empty()) idle_ = false;  // its batch is coming
        if (engine_ == nullptr) {
          for (DpRouted& s : mine_in) inbox_.push_back(std::move(s));
          inbox_aborts_.insert(inbox_aborts_.end(), mine_aborts.begin(), mine_aborts.end());
          mine_in.clear();
          mine_aborts.clear();
        }
      }
      for (DpRouted& s : mine_in) engine->submit(std::move(s.req));
      for (uint64_t id : mine_aborts) engine->abort(id);
    }
  }

  if (any_stop) {
    // The last round: nothing runs in it (a batch taken here fails in wait()).
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopped_ = true;
      running_batch_ = false;
    }
    done_cv_.notify_all();
    StepMessage m;
    m.kind = StepKind::shutdown;
    try {
      send_followers(std::move(m));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dsaserve ranks: warning: rank %lld could not tell its followers to stop: %s\n",
                   static_cast<long long>(ranks_->rank()), e.what());
    }
    return false;
  }
  active = any_tokens || total > 0;
  if (!any_tokens) {
    if (std::chrono::steady_clock::now() - follower_last_ >= beat_) {
      StepMessage m;
      m.kind = StepKind::idle;
      send_followers(std::move(m));
    }
    return true;
  }
  model::ForwardOptions opt = opt_;
  opt.dp_tokens = tokens;
  opt.dp_decode = decode;
  StepMessage m;
  m.kind = mine ? StepKind::dp_step : StepKind::dp_idle;
  m.dp_tokens = tokens;
  m.dp_decode = decode;
  if (mine) m.batch = *mine;
  {
    trace::Scope span("step_broadcast", "engine");
    span.arg("tokens", tokens[size_t(ranks_->dp_rank())]);
    send_followers(std::move(m));
  }
  if (mine) {
    Tensor logits = model_->forward(*mine, *cache_, opt).logits.to(Device::cpu).contiguous();
    {
      std::lock_guard<std::mutex> lk(mu_);
      result_ = std::move(logits);
      batch_done_ = true;
      running_batch_ = false;
    }
    done_cv_.notify_all();
  } else {
    model_->idle_step(opt);
  }
  return true;
}

// ---------------------------------------------------------------------------------------------------------

DpRunner::DpRunner(std::shared_ptr<DpLink> link, model::KvCache& cache, const StepInit& init)
    : link_(std::move(link)) {
  link_->attach(cache, init);
}

std::unique_ptr<Engine> make_dp_engine(std::shared_ptr<const model::Model> model, EngineConfig cfg,
                                       std::shared_ptr<DpLink> link) {
  DSA_CHECK(model != nullptr && link != nullptr, "ranks: a DP engine needs its model and link");
  DSA_CHECK(!cfg.speculative.enabled(),
            "--speculative-algorithm with --attn-dp-size {}: speculative decoding runs on one rank only",
            link->ranks().dp_size());
  DSA_CHECK(!cfg.sample_on_device, "--sampling-device gpu with --attn-dp-size {} is not run yet",
            link->ranks().dp_size());
  DSA_CHECK(cfg.kv_pages > 0 && cfg.page_size > 0, "ranks: a DP engine of {} KV pages of {} tokens",
            cfg.kv_pages, cfg.page_size);
  cfg.ranks = nullptr;  // the link drives the steps
  cfg.forward.dist = nullptr;
  cfg.forward.all_logits = false;
  cfg.forward.keep_hidden = false;
  cfg.cuda_graph_max_bs = 0;
  const bool mtp = model->num_mtp_layers() > 0;
  model::KvCache cache = cfg.kv_dtype
                             ? model::KvCache::create(model->config(), cfg.kv_pages, cfg.page_size, mtp,
                                                      model->weights().embed_tokens.device(), cfg.kv_dtype)
                             : model->make_cache(cfg.kv_pages, cfg.page_size);
  const StepInit init = StepInit::of(cfg.kv_pages, cfg.page_size, mtp, cfg.kv_dtype, cfg.forward);
  const ModelShape shape{model->config().vocab_size, model->config().max_position_embeddings};
  return std::make_unique<Engine>(
      shape, std::move(cache),
      [link, init](model::KvCache& c) -> std::unique_ptr<ModelRunner> {
        return std::make_unique<DpRunner>(link, c, init);
      },
      std::move(cfg));
}

int serve_dp_group(std::shared_ptr<const model::Model> model, std::shared_ptr<Ranks> ranks) {
  auto link = std::make_shared<DpLink>(model, ranks);
  EngineConfig cfg = link->receive_engine_config();
  std::unique_ptr<Engine> engine = make_dp_engine(std::move(model), std::move(cfg), link);
  link->serve(engine.get());
  engine->start();
  link->wait_stopped();
  engine->stop();
  engine.reset();
  return 0;
}

}  // namespace dsaserve::runtime
