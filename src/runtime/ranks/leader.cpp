#include "runtime/ranks/leader.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "trace/trace.h"

namespace dsaserve::runtime {

std::chrono::milliseconds beat_interval(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 4, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
}

LeaderRunner::LeaderRunner(std::unique_ptr<ModelRunner> inner, std::shared_ptr<Ranks> ranks,
                           const StepInit& init)
    : inner_(std::move(inner)), ranks_(std::move(ranks)), interval_(beat_interval(ranks_->timeout())) {
  DSA_CHECK(inner_ != nullptr && ranks_ != nullptr, "ranks: a leader needs a model runner and its ranks");
  DSA_CHECK(ranks_->leader(), "ranks: rank {} cannot lead (rank 0 leads)", ranks_->rank());
  {
    std::lock_guard<std::mutex> lk(mu_);
    StepMessage m;
    m.kind = StepKind::init;
    m.init = init;
    send(std::move(m));  // throws to the caller: nothing runs yet
  }
  beat_ = std::thread([this] { beat(); });
}

LeaderRunner::~LeaderRunner() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (beat_.joinable()) beat_.join();
  inner_.reset();  // a step still in flight finishes first (the followers run it too)
  try {
    std::lock_guard<std::mutex> lk(mu_);
    StepMessage m;
    m.kind = StepKind::shutdown;
    send(std::move(m));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsaserve ranks: warning: rank 0 could not tell the other ranks to stop: %s\n",
                 e.what());
  }
}

void LeaderRunner::send(StepMessage m) {
  m.seq = seq_++;
  send_step_message(ranks_->control(), m);
  last_ = std::chrono::steady_clock::now();
}

void LeaderRunner::die(const char* what, const std::exception& e) const {
  // The ranks are out of step (a peer died or hung, or the step failed on every rank): nothing this rank
  // serves can be right any more. The launcher ends the others when this process exits.
  std::fflush(stdout);
  std::fprintf(stderr, "error: rank 0 of %lld: %s failed: %s; ending this rank\n",
               static_cast<long long>(ranks_->world_size()), what, e.what());
  std::fflush(stderr);
  std::_Exit(1);
}

void LeaderRunner::launch(model::ForwardBatch fb) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    DSA_CHECK(!busy_, "ranks: a step is already in flight");
    busy_ = true;
    StepMessage m;
    m.kind = StepKind::step;
    m.batch = fb;
    try {
      trace::Scope span("step_broadcast", "engine");
      span.arg("tokens", fb.num_tokens());
      send(std::move(m));
    } catch (const std::exception& e) {
      die("sending a step to the other ranks", e);
    }
  }
  inner_->launch(std::move(fb));
}

Tensor LeaderRunner::wait() {
  Tensor logits;
  try {
    logits = inner_->wait();
  } catch (const std::exception& e) {
    die("a step", e);
  }
  std::lock_guard<std::mutex> lk(mu_);
  busy_ = false;
  last_ = std::chrono::steady_clock::now();
  return logits;
}

void LeaderRunner::beat() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, interval_ / 2, [&] { return stop_; });
    if (stop_ || busy_ || std::chrono::steady_clock::now() - last_ < interval_) continue;
    try {
      StepMessage m;
      m.kind = StepKind::idle;
      send(std::move(m));
    } catch (const std::exception& e) {
      die("an idle beat to the other ranks", e);
    }
  }
}

int64_t follow_steps(const model::Model& model, const Ranks& ranks) {
  DSA_CHECK(!ranks.leader(), "ranks: rank {} leads its attention-TP group; it does not follow", ranks.rank());
  dist::Communicator& control = ranks.control();
  StepMessage m = receive_step_message(control);
  DSA_CHECK(m.kind == StepKind::init && m.seq == 0, "ranks: rank {} expected the leader's init, got {} #{}",
            ranks.rank(), to_string(m.kind), m.seq);
  const StepInit init = m.init;
  DSA_CHECK(init.mtp_layers == (model.num_mtp_layers() > 0),
            "ranks: the leader's KV cache {} MTP layers, rank {}'s model {}",
            init.mtp_layers ? "has" : "has no", ranks.rank(),
            model.num_mtp_layers() > 0 ? "has some" : "has none");
  model::KvCache cache =
      init.kv_dtype ? model::KvCache::create(model.config(), init.num_pages, init.page_size, init.mtp_layers,
                                             model.weights().embed_tokens.device(), init.kv_dtype)
                    : model.make_cache(init.num_pages, init.page_size);
  model::ForwardOptions opt = init.forward(&ranks.groups());
  int64_t steps = 0;
  for (int64_t seq = 1;; ++seq) {
    m = receive_step_message(control);
    DSA_CHECK(m.seq == seq, "ranks: rank {} expected step message #{}, got #{} ({})", ranks.rank(), seq,
              m.seq, to_string(m.kind));
    switch (m.kind) {
      case StepKind::idle: break;
      case StepKind::shutdown: return steps;
      case StepKind::step: {
        // The leader's logits rows, here only to keep the collectives in step; the host copy ends the step.
        (void)model.forward(m.batch, cache, opt).logits.to(Device::cpu);
        ++steps;
        break;
      }
      case StepKind::dp_step:  // attention DP (runtime/ranks/dp.h): every DP group's token counts too
      case StepKind::dp_idle: {
        opt.dp_tokens = std::move(m.dp_tokens);
        opt.dp_decode = m.dp_decode;
        if (m.kind == StepKind::dp_step) {
          (void)model.forward(m.batch, cache, opt).logits.to(Device::cpu);
          ++steps;
        } else {
          model.idle_step(opt);
        }
        opt.dp_tokens.clear();
        break;
      }
      case StepKind::init: fail("ranks: rank {} received a second init (#{})", ranks.rank(), m.seq);
    }
  }
}

}  // namespace dsaserve::runtime
