#include "server/metrics.h"

#include <fmt/format.h>

namespace dsaserve::server {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  cum += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, sum_, name,
                     count_);
}

ServerMetrics::ServerMetrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}),
      e2e_({0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}) {}

std::string endpoint_label(std::string_view path) {
  static constexpr std::string_view kRoutes[] = {"/health",    "/health_generate",     "/metrics",
                                                 "/v1/models", "/v1/chat/completions", "/v1/completions"};
  for (std::string_view r : kRoutes) {
    if (path == r) return std::string(r);
  }
  constexpr std::string_view kModel = "/v1/models/";
  if (path.size() > kModel.size() && path.substr(0, kModel.size()) == kModel) return "/v1/models/{id}";
  return "unmatched";
}

std::string escape_label_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void ServerMetrics::request_done(std::string_view path, int status) {
  std::string label = endpoint_label(path);
  std::lock_guard<std::mutex> lk(mu_);
  ++requests_[{std::move(label), status}];
}
void ServerMetrics::request_aborted(std::string_view path) {
  std::string label = endpoint_label(path);
  std::lock_guard<std::mutex> lk(mu_);
  ++aborted_[std::move(label)];
}
void ServerMetrics::observe_ttft(double s) {
  std::lock_guard<std::mutex> lk(mu_);
  ttft_.observe(s);
}
void ServerMetrics::observe_itl(double s) {
  std::lock_guard<std::mutex> lk(mu_);
  itl_.observe(s);
}
void ServerMetrics::observe_e2e(double s) {
  std::lock_guard<std::mutex> lk(mu_);
  e2e_.observe(s);
}
void ServerMetrics::add_tokens(int64_t prompt, int64_t completion) {
  std::lock_guard<std::mutex> lk(mu_);
  prompt_tokens_ += prompt;
  completion_tokens_ += completion;
}

std::string ServerMetrics::render(const runtime::EngineStats& e, int64_t active_requests) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string out;
  out += "# HELP dsaserve_requests_total HTTP requests answered, by endpoint and status.\n";
  out += "# TYPE dsaserve_requests_total counter\n";
  for (const auto& [key, n] : requests_) {
    out += fmt::format("dsaserve_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n",
                       escape_label_value(key.first), key.second, n);
  }
  out +=
      "# HELP dsaserve_aborted_requests_total Generation requests whose client went away before the answer "
      "was complete, by endpoint.\n";
  out += "# TYPE dsaserve_aborted_requests_total counter\n";
  for (const char* ep : {"/v1/chat/completions", "/v1/completions"}) {
    const auto it = aborted_.find(ep);
    out += fmt::format("dsaserve_aborted_requests_total{{endpoint=\"{}\"}} {}\n", ep,
                       it == aborted_.end() ? 0 : it->second);
  }
  auto counter = [&](const char* name, const char* help, int64_t v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
  };
  auto gauge = [&](const char* name, const char* help, double v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
  };
  counter("dsaserve_prompt_tokens_total", "Prompt tokens of finished requests.", prompt_tokens_);
  counter("dsaserve_generation_tokens_total", "Completion tokens of finished requests.", completion_tokens_);
  counter("dsaserve_prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache.",
          e.prefix_hit_tokens);
  counter("dsaserve_engine_prompt_tokens_total", "Prompt tokens of requests the engine admitted.",
          e.prompt_tokens);
  counter("dsaserve_engine_prefill_tokens_total", "Tokens prefilled, recomputation included.",
          e.prefill_tokens);
  counter("dsaserve_engine_generated_tokens_total", "Tokens sampled by the engine.", e.generated_tokens);
  counter("dsaserve_engine_steps_total", "Model steps run.", e.steps);
  counter("dsaserve_cuda_graph_replays_total", "Decode steps that replayed a captured CUDA graph.",
          e.cuda_graph_replays);
  counter("dsaserve_retractions_total", "Requests retracted for lack of KV pages.", e.retractions);
  counter("dsaserve_spec_verify_rounds_total", "Speculative rounds verified (one per request per step).",
          e.spec_rounds);
  counter("dsaserve_spec_draft_tokens_total", "Draft tokens the MTP layer proposed.", e.spec_drafted_tokens);
  counter("dsaserve_spec_accepted_tokens_total", "Draft tokens the target accepted.", e.spec_accepted_tokens);
  {
    // Accept length (tokens a round yields: accepted drafts + 1) as a cumulative histogram.
    const char* name = "dsaserve_spec_accept_length";
    out += fmt::format("# HELP {} Tokens per speculative round (accepted drafts + 1).\n# TYPE {} histogram\n",
                       name, name);
    int64_t cum = 0, sum = 0;
    for (size_t len = 1; len < e.spec_accept_length_hist.size(); ++len) {
      cum += e.spec_accept_length_hist[len];
      sum += int64_t(len) * e.spec_accept_length_hist[len];
      out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, len, cum);
    }
    out +=
        fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, sum, name, cum);
  }
  gauge("dsaserve_engine_busy_seconds_total", "Seconds spent in engine steps.", e.busy_seconds);
  gauge("dsaserve_scheduler_seconds_total", "Of which the scheduler's own CPU time.", e.schedule_seconds);
  gauge("dsaserve_engine_launch_gap_seconds_total",
        "Model idle time between back-to-back steps (engine work not hidden by overlap scheduling).",
        e.launch_gap_seconds);
  gauge("dsaserve_num_waiting_requests", "Requests in the waiting queue.", double(e.num_waiting));
  gauge("dsaserve_num_running_requests", "Requests in the running batch.", double(e.num_running));
  gauge("dsaserve_last_batch_size", "Requests in the last step.", double(e.last_batch_size));
  gauge("dsaserve_active_http_requests", "Generation requests the server is answering.",
        double(active_requests));
  gauge("dsaserve_kv_pages_total", "KV pool pages.", double(e.kv_pages_total));
  gauge("dsaserve_kv_pages_used", "KV pool pages in use (requests and prefix cache).",
        double(e.kv_pages_total - e.kv_pages_free));
  gauge("dsaserve_kv_pages_free", "KV pool pages free.", double(e.kv_pages_free));
  gauge("dsaserve_prefix_cache_pages", "KV pages held by the prefix cache.", double(e.prefix_cache_pages));
  ttft_.render(out, "dsaserve_time_to_first_token_seconds", "Time from request arrival to the first token.");
  itl_.render(out, "dsaserve_inter_token_latency_seconds", "Time between consecutive tokens of a request.");
  e2e_.render(out, "dsaserve_e2e_request_latency_seconds", "Time from request arrival to its last token.");
  return out;
}

std::string render_dp_groups(const std::vector<runtime::EngineStats>& groups) {
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help, auto value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
    for (size_t d = 0; d < groups.size(); ++d)
      out += fmt::format("{}{{dp_rank=\"{}\"}} {}\n", name, d, value(groups[d]));
  };
  using S = runtime::EngineStats;
  family("dsaserve_dp_num_running_requests", "gauge", "Requests in the running batch, per DP group.",
         [](const S& e) { return e.num_running; });
  family("dsaserve_dp_num_waiting_requests", "gauge", "Requests in the waiting queue, per DP group.",
         [](const S& e) { return e.num_waiting; });
  family("dsaserve_dp_kv_pages_used", "gauge", "KV pool pages in use, per DP group.",
         [](const S& e) { return e.kv_pages_total - e.kv_pages_free; });
  family("dsaserve_dp_prefix_cache_pages", "gauge", "KV pages held by the prefix cache, per DP group.",
         [](const S& e) { return e.prefix_cache_pages; });
  family("dsaserve_dp_engine_generated_tokens_total", "counter", "Tokens sampled, per DP group.",
         [](const S& e) { return e.generated_tokens; });
  family("dsaserve_dp_engine_steps_total", "counter", "Model steps run, per DP group.",
         [](const S& e) { return e.steps; });
  return out;
}

}  // namespace dsaserve::server
