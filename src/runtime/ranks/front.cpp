#include "runtime/ranks/front.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "core/error.h"

namespace dsaserve::runtime {

LoadBalance parse_load_balance(const std::string& name) {
  if (name == "round_robin") return LoadBalance::round_robin;
  if (name == "shortest_queue") return LoadBalance::shortest_queue;
  fail("--load-balance-method '{}': expected round_robin or shortest_queue", name);
}

const char* to_string(LoadBalance lb) {
  return lb == LoadBalance::round_robin ? "round_robin" : "shortest_queue";
}

namespace {

void add_stats(EngineStats& a, const EngineStats& b) {
  using Count = std::pair<int64_t*, int64_t>;
  using Seconds = std::pair<double*, double>;
  for (auto [x, y] : std::initializer_list<Count>{{&a.num_waiting, b.num_waiting},
                                                  {&a.num_running, b.num_running},
                                                  {&a.kv_pages_total, b.kv_pages_total},
                                                  {&a.kv_pages_free, b.kv_pages_free},
                                                  {&a.prefix_cache_pages, b.prefix_cache_pages},
                                                  {&a.steps, b.steps},
                                                  {&a.prompt_tokens, b.prompt_tokens},
                                                  {&a.prefix_hit_tokens, b.prefix_hit_tokens},
                                                  {&a.prefill_tokens, b.prefill_tokens},
                                                  {&a.generated_tokens, b.generated_tokens},
                                                  {&a.retractions, b.retractions},
                                                  {&a.last_batch_size, b.last_batch_size},
                                                  {&a.cuda_graphs, b.cuda_graphs},
                                                  {&a.cuda_graph_replays, b.cuda_graph_replays},
                                                  {&a.spec_rounds, b.spec_rounds},
                                                  {&a.spec_drafted_tokens, b.spec_drafted_tokens},
                                                  {&a.spec_accepted_tokens, b.spec_accepted_tokens}})
    *x += y;
  for (auto [x, y] : std::initializer_list<Seconds>{{&a.busy_seconds, b.busy_seconds},
                                                    {&a.schedule_seconds, b.schedule_seconds},
                                                    {&a.launch_gap_seconds, b.launch_gap_seconds},
                                                    {&a.cuda_graph_seconds, b.cuda_graph_seconds}})
    *x += y;
  if (a.spec_accept_length_hist.size() < b.spec_accept_length_hist.size())
    a.spec_accept_length_hist.resize(b.spec_accept_length_hist.size());
  for (size_t i = 0; i < b.spec_accept_length_hist.size(); ++i)
    a.spec_accept_length_hist[i] += b.spec_accept_length_hist[i];
}

}  // namespace

DpFront::DpFront(std::shared_ptr<const model::Model> model, EngineConfig cfg, std::shared_ptr<Ranks> ranks,
                 LoadBalance lb)
    : lb_(lb) {
  DSA_CHECK(ranks != nullptr && ranks->front() && ranks->dp_size() > 1,
            "ranks: the DP front runs on rank 0 of an attention DP layout");
  groups_ = ranks->dp_size();
  unfinished_.assign(size_t(groups_), 0);
  routed_.assign(size_t(groups_), 0);
  remote_.resize(size_t(groups_));
  link_ = std::make_shared<DpLink>(model, ranks);
  link_->on_outputs([this](int64_t g, std::vector<StepOutput>& outs, const EngineStats& st) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      remote_[size_t(g)] = st;
    }
    push(g, outs);
  });
  cfg.forward.all_logits = false;  // as the engine runs its own forward (every leader: the front's settings)
  link_->send_engine_config(cfg);
  engine_ = make_dp_engine(std::move(model), std::move(cfg), link_);
}

DpFront::~DpFront() { stop(); }

void DpFront::start() {
  engine_->start();
  pump_ = std::thread([this] { pump(); });
}

void DpFront::stop() {
  if (stopped_) return;
  stopped_ = true;
  engine_->stop();
  link_->stop();
  pump_stop_ = true;
  if (pump_.joinable()) pump_.join();
}

void DpFront::pump() {
  while (!pump_stop_) {
    std::vector<StepOutput> outs;
    if (engine_->wait_outputs(outs, std::chrono::milliseconds(50))) push(0, outs);
  }
}

void DpFront::push(int64_t group, std::vector<StepOutput>& outs) {
  if (outs.empty()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (StepOutput& o : outs) {
      if (o.finish != FinishReason::none) {
        auto it = owner_.find(o.id);
        if (it != owner_.end() && it->second == group) {
          unfinished_[size_t(group)] -= 1;
          owner_.erase(it);
        }
      }
      out_.push_back(std::move(o));
    }
  }
  cv_.notify_all();
}

void DpFront::submit(GenerateRequest req) {
  int64_t g = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (req.params.constraint == nullptr && owner_.find(req.id) == owner_.end()) {
      if (lb_ == LoadBalance::round_robin) {
        g = next_;
        next_ = (next_ + 1) % groups_;
      } else {
        g = int64_t(std::min_element(unfinished_.begin(), unfinished_.end()) - unfinished_.begin());
      }
    }
    // (A constrained request's grammar matcher lives in this process: DP group 0 runs it. An id already
    // live goes to its group, whose engine answers that it is running.)
    if (auto it = owner_.find(req.id); it != owner_.end()) {
      g = it->second;
    } else {
      owner_[req.id] = g;
      unfinished_[size_t(g)] += 1;
    }
    routed_[size_t(g)] += 1;
  }
  if (g == 0) {
    engine_->submit(std::move(req));
  } else {
    link_->route({g, std::move(req)});
  }
}

void DpFront::abort(uint64_t id) {
  int64_t g = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (auto it = owner_.find(id); it != owner_.end()) g = it->second;
  }
  if (g == 0) {
    engine_->abort(id);
  } else {
    link_->route_abort(g, id);
  }
}

bool DpFront::wait_outputs(std::vector<StepOutput>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  if (out_.empty() && !cv_.wait_for(lk, timeout, [&] { return !out_.empty(); })) return false;
  for (auto& o : out_) out.push_back(std::move(o));
  out_.clear();
  return true;
}

std::vector<EngineStats> DpFront::group_stats() const {
  std::vector<EngineStats> all;
  all.push_back(engine_->stats());
  std::lock_guard<std::mutex> lk(mu_);
  for (int64_t g = 1; g < groups_; ++g) all.push_back(remote_[size_t(g)]);
  return all;
}

EngineStats sum_stats(const std::vector<EngineStats>& groups) {
  DSA_CHECK(!groups.empty(), "sum_stats: no DP group");
  EngineStats sum = groups[0];
  for (size_t g = 1; g < groups.size(); ++g) add_stats(sum, groups[g]);
  return sum;
}

EngineStats DpFront::stats() const { return sum_stats(group_stats()); }

std::vector<int64_t> DpFront::routed() const {
  std::lock_guard<std::mutex> lk(mu_);
  return routed_;
}

std::unique_ptr<EngineFront> make_front(std::shared_ptr<const model::Model> model, EngineConfig cfg,
                                        LoadBalance lb) {
  if (cfg.ranks && cfg.ranks->dp_size() > 1) {
    std::shared_ptr<Ranks> ranks = cfg.ranks;
    return std::make_unique<DpFront>(std::move(model), std::move(cfg), std::move(ranks), lb);
  }
  return std::make_unique<LocalFront>(std::move(model), std::move(cfg));
}

}  // namespace dsaserve::runtime
