#pragma once
// Prometheus text exposition for /metrics: the server's counters and latency histograms (TTFT,
// inter-token latency, end-to-end), plus the engine's gauges (queues, batch, KV pages, prefix cache).
// Thread-safe.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/engine/engine.h"

namespace dsaserve::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // Appends the _bucket/_sum/_count lines of metric `name`.
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// The `endpoint` label of a request path: the route it matched ("/v1/models/{id}" for any model id), or
// "unmatched" for every path the server has no route for, so that the label set stays bounded whatever
// clients send.
std::string endpoint_label(std::string_view path);

// A Prometheus label value escaped for the text exposition (backslash, double quote, newline).
std::string escape_label_value(std::string_view v);

// Attention DP: each DP group's engine gauges and counters, labelled dp_rank="d" (the unlabelled engine
// metrics of ServerMetrics::render are their sums).
std::string render_dp_groups(const std::vector<runtime::EngineStats>& groups);

class ServerMetrics {
 public:
  ServerMetrics();
  // Counts a request answered with `status`; `path` is mapped by endpoint_label().
  void request_done(std::string_view path, int status);
  // A generation request whose client went away before its answer was complete (its engine requests
  // were aborted).
  void request_aborted(std::string_view path);
  void observe_ttft(double s);
  void observe_itl(double s);
  void observe_e2e(double s);
  void add_tokens(int64_t prompt, int64_t completion);
  std::string render(const runtime::EngineStats& e, int64_t active_requests) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> aborted_;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0;
  Histogram ttft_, itl_, e2e_;
};

}  // namespace dsaserve::server
