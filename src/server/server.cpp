#include "server/server.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/signal_set.hpp>
#include <cctype>
#include <csignal>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "chat/chat_config.h"
#include "chat/chat_template.h"
#include "chat/output_parser.h"
#include "core/error.h"
#include "plan/trace_summary.h"
#include "runtime/engine/cuda_graph_runner.h"
#include "runtime/engine/device.h"
#include "runtime/engine/memory_plan.h"
#include "runtime/ranks/ranks.h"
#include "server/builtin.h"
#include "server/constrained.h"
#include "server/json_body.h"
#include "server/session.h"
#include "trace/trace.h"

namespace dsaserve::server {

namespace {

using nlohmann::json;

std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  DSA_CHECK(f.good(), "cannot read {}", p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// --tool-call-parser: SGLang's spellings and the chat module's.
chat::ToolCallFormat tool_format(const std::string& name) {
  if (name.empty()) return chat::ToolCallFormat::kNone;
  static const std::map<std::string, std::string> sglang = {{"deepseekv3", "deepseek_v3"},
                                                            {"deepseekv31", "deepseek_v31"},
                                                            {"deepseekv32", "deepseek_v32"},
                                                            {"deepseek-r1", "deepseek_r1"}};
  auto it = sglang.find(name);
  return chat::tool_call_format_from_name(it == sglang.end() ? name : it->second);
}

// "Authorization: Bearer <key>", the scheme in any case (RFC 7235), spaces around the key allowed.
bool bearer_matches(std::string_view auth, const std::string& key) {
  auto trim = [](std::string_view v) {
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
    return v;
  };
  auth = trim(auth);
  if (auth.size() < 7) return false;
  for (size_t i = 0; i < 6; ++i) {
    if (std::tolower(static_cast<unsigned char>(auth[i])) != "bearer"[i]) return false;
  }
  if (auth[6] != ' ' && auth[6] != '\t') return false;
  return trim(auth.substr(7)) == key;
}

// Threads that prepare requests (template, tokenizer, grammar) off the I/O thread.
constexpr int kPrepThreads = 4;

class Server {
 public:
  Server(const ServerConfig& cfg, std::shared_ptr<model::Model> model, tokenizer::Tokenizer tok,
         std::optional<chat::ChatTemplate> chat, std::optional<chat::ChatTemplate> chat_tools)
      : cfg_(cfg),
        model_(std::move(model)),
        tok_(std::move(tok)),
        chat_(std::move(chat)),
        chat_tools_(std::move(chat_tools)),
        chat_form_(chat_ ? chat::probe_tool_call_form(*chat_) : chat::ToolCallForm{}),
        chat_tools_form_(chat_tools_ ? chat::probe_tool_call_form(*chat_tools_) : chat::ToolCallForm{}),
        acceptor_(ioc_),
        signals_(ioc_, SIGINT, SIGTERM),
        drain_timer_(ioc_) {
    // One engine, or with attention DP the controller over every DP group's (runtime/ranks/front.h).
    engine_ = runtime::make_front(model_, cfg_.engine, runtime::parse_load_balance(cfg_.load_balance_method));
    context_ = engine_->config().scheduler.max_context;
    pool_tokens_ = (engine_->config().kv_pages - 1) * engine_->config().page_size;
    max_prompt_ = cfg_.max_prompt_tokens > 0 ? std::min(cfg_.max_prompt_tokens, context_ - 1) : context_ - 1;
    ctx_.engine = engine_.get();
    ctx_.tokenizer = &tok_;
    ctx_.metrics = &metrics_;
    ctx_.model_name = cfg_.served_model_name;
    ctx_.reasoning = !cfg_.reasoning_parser.empty();
    ctx_.tool_format = tool_format(cfg_.tool_call_parser);
    grammar_ = make_grammar_backend(tok_, model_->config().vocab_size, cfg_.engine.scheduler.eos_token_ids);
    ctx_.grammar = grammar_.get();
    router_ = [this](const std::shared_ptr<Session>& s, const http::request<http::string_body>& r) {
      route(s, r);
    };
  }

  runtime::EngineStats engine_stats() const { return engine_->stats(); }

  int run() {
    // --host: an address or a name (localhost); the first address it resolves to.
    beast::error_code rec;
    tcp::resolver resolver(ioc_);
    const auto found = resolver.resolve(cfg_.host, std::to_string(cfg_.port),
                                        tcp::resolver::passive | tcp::resolver::numeric_service, rec);
    DSA_CHECK(!rec && !found.empty(), "--host {}: cannot resolve it: {}", cfg_.host, rec.message());
    tcp::endpoint ep = found.begin()->endpoint();
    for (const auto& r : found) {
      if (r.endpoint().address().is_v4()) {
        ep = r.endpoint();  // IPv4 first (localhost: 127.0.0.1)
        break;
      }
    }
    acceptor_.open(ep.protocol());
    acceptor_.set_option(net::socket_base::reuse_address(true));
    acceptor_.bind(ep, rec);
    DSA_CHECK(!rec, "--host {} --port {}: cannot listen there: {}", cfg_.host, cfg_.port, rec.message());
    acceptor_.listen(net::socket_base::max_listen_connections);
    engine_->start();
    pump_ = std::thread([this] { pump(); });
    signals_.async_wait([this](beast::error_code ec, int sig) {
      if (!ec) begin_drain(sig);
    });
    accept();
    const auto bound = acceptor_.local_endpoint();
    const std::string addr =
        bound.address().is_v6() ? "[" + bound.address().to_string() + "]" : bound.address().to_string();
    fmt::print("dsaserve serve: listening on http://{}:{} (model {}, {} KV pages of {} tokens, context {})\n",
               addr, bound.port(), cfg_.served_model_name, cfg_.engine.kv_pages, cfg_.engine.page_size,
               context_);
    std::fflush(stdout);
    // Every handler catches what a request can throw; should anything still escape one, it is logged
    // and the I/O thread goes on serving (an exception must not end the process).
    for (;;) {
      try {
        ioc_.run();
        break;
      } catch (const std::exception& e) {
        fmt::print(stderr, "dsaserve serve: error: unexpected exception on the I/O thread: {}\n",
                   printable(e.what()));
      } catch (...) {
        fmt::print(stderr, "dsaserve serve: error: unexpected exception on the I/O thread\n");
      }
    }
    // Requests still on the preparation pool stop at their next check; queued ones never start.
    stopping_ = true;
    prep_pool_.stop();
    prep_pool_.join();
    pump_stop_ = true;
    if (pump_.joinable()) pump_.join();
    engine_->stop();
    return 0;
  }

 private:
  void accept() {
    acceptor_.async_accept(net::make_strand(ioc_), [this](beast::error_code ec, tcp::socket socket) {
      if (draining_ || !acceptor_.is_open()) return;  // closed by the drain
      if (ec) {
        // Out of descriptors (EMFILE, ENFILE) or memory, or a connection reset while queued: the
        // listening socket stays; try again after a pause (10 ms, doubling to 1 s) so that an error that
        // persists does not spin. Connections wait in the backlog meanwhile.
        if (accept_backoff_ms_ == 0) {
          fmt::print(stderr, "dsaserve serve: warning: accept failed: {} (retrying)\n", ec.message());
        }
        accept_backoff_ms_ = std::min<int64_t>(std::max<int64_t>(10, accept_backoff_ms_ * 2), 1000);
        accept_timer_.expires_after(std::chrono::milliseconds(accept_backoff_ms_));
        accept_timer_.async_wait([this](beast::error_code e) {
          if (!e) accept();
        });
        return;
      }
      accept_backoff_ms_ = 0;
      std::make_shared<Session>(std::move(socket), router_, cfg_.max_body_bytes, cfg_.read_timeout_s,
                                &open_writes_)
          ->start();
      accept();
    });
  }

  void begin_drain(int sig) {
    fmt::print("dsaserve serve: signal {}, not accepting new requests; {} in flight\n", sig,
               ctx_.active_jobs);
    std::fflush(stdout);
    draining_ = true;
    drain_start_ = std::chrono::steady_clock::now();
    beast::error_code ec;
    acceptor_.close(ec);
    check_drained();
  }

  void check_drained() {
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - drain_start_).count();
    if (ctx_.active_jobs == 0 && preparing_ == 0) {
      flush_until_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      return stop_when_flushed();  // the last answers are written out first
    }
    if (waited >= cfg_.shutdown_grace_s) return end_grace();
    drain_timer_.expires_after(std::chrono::milliseconds(50));
    drain_timer_.async_wait([this](beast::error_code) { check_drained(); });
  }

  // The grace is over: what still runs ends with an error (a stream gets an error event, then [DONE]),
  // then the I/O thread stops once those last writes are out (at most 1 s more).
  void end_grace() {
    stopping_ = true;
    std::vector<std::shared_ptr<Job>> jobs;
    for (auto& [id, weak] : ctx_.routes) {
      if (auto job = weak.lock()) jobs.push_back(std::move(job));
    }
    std::sort(jobs.begin(), jobs.end());
    jobs.erase(std::unique(jobs.begin(), jobs.end()), jobs.end());
    fmt::print("dsaserve serve: shutdown grace of {} s over; ending {} requests with an error\n",
               cfg_.shutdown_grace_s, jobs.size());
    std::fflush(stdout);
    for (const auto& job : jobs) {
      try {
        job->fail(ApiError(503,
                           fmt::format("the server shut down before the request finished (shutdown "
                                       "grace {} s)",
                                       cfg_.shutdown_grace_s),
                           "", "server_error"));
      } catch (const std::exception&) {
        job->cancel();
      }
    }
    flush_until_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    stop_when_flushed();
  }

  void stop_when_flushed() {
    if (open_writes_ == 0 || std::chrono::steady_clock::now() >= flush_until_) return ioc_.stop();
    drain_timer_.expires_after(std::chrono::milliseconds(10));
    drain_timer_.async_wait([this](beast::error_code) { stop_when_flushed(); });
  }

  // Moves engine outputs to the I/O thread, where each goes to its job in order.
  void pump() {
    while (!pump_stop_) {
      std::vector<runtime::StepOutput> outs;
      if (!engine_->wait_outputs(outs, std::chrono::milliseconds(100))) continue;
      net::post(ioc_, [this, outs = std::move(outs)] {
        for (const runtime::StepOutput& o : outs) dispatch(o);
      });
    }
  }

  void dispatch(const runtime::StepOutput& o) {
    auto it = ctx_.routes.find(o.id);
    if (it == ctx_.routes.end()) return;
    std::shared_ptr<Job> job = it->second.lock();
    if (!job) {
      if (o.finish != runtime::FinishReason::none) {
        ctx_.routes.erase(it);
      } else {
        engine_->abort(o.id);
      }
      return;
    }
    try {
      job->on_output(o);
    } catch (const std::exception& e) {
      fmt::print(stderr, "dsaserve serve: error: request failed while writing its output: {}\n",
                 printable(e.what()));
      try {
        job->fail(ApiError(500, printable(e.what()), "", "server_error"));
      } catch (const std::exception&) {
        job->cancel();
      }
    }
  }

  void route(const std::shared_ptr<Session>& s, const http::request<http::string_body>& req) {
    std::string path(req.target());
    if (auto q = path.find('?'); q != std::string::npos) path.resize(q);
    const auto arrival = std::chrono::steady_clock::now();
    try {
      if (path.rfind("/v1/", 0) == 0 && !cfg_.api_key.empty()) {
        const auto auth = req[http::field::authorization];
        if (!bearer_matches(std::string_view(auth.data(), auth.size()), cfg_.api_key)) {
          throw ApiError(401, "Incorrect or missing API key (send \"Authorization: Bearer <key>\")", "",
                         "invalid_request_error", "invalid_api_key");
        }
      }
      const bool get = req.method() == http::verb::get, post = req.method() == http::verb::post;
      if (path == "/health" || path == "/health_generate") {
        if (!get) throw ApiError(405, "use GET");
        if (draining_) throw ApiError(503, "shutting down", "", "server_error");
        metrics_.request_done(path, 200);
        return s->send(200, "{\"status\":\"ok\"}", "application/json");
      }
      if (path == "/metrics") {
        if (!get) throw ApiError(405, "use GET");
        metrics_.request_done(path, 200);
        const std::vector<runtime::EngineStats> groups = engine_->group_stats();  // one snapshot
        std::string text = metrics_.render(runtime::sum_stats(groups), ctx_.active_jobs);
        if (groups.size() > 1) text += render_dp_groups(groups);
        return s->send(200, text, "text/plain; version=0.0.4");
      }
      if (path == "/v1/models") {
        if (!get) throw ApiError(405, "use GET");
        metrics_.request_done(path, 200);
        return s->send_json(200, json{{"object", "list"}, {"data", json::array({model_card()})}});
      }
      if (path.rfind("/v1/models/", 0) == 0) {
        if (!get) throw ApiError(405, "use GET");
        const std::string id = path.substr(11);
        if (id != cfg_.served_model_name) {
          throw ApiError(404,
                         fmt::format("The model '{}' does not exist (this server serves '{}')", printable(id),
                                     cfg_.served_model_name),
                         "model", "invalid_request_error", "model_not_found");
        }
        metrics_.request_done(path, 200);
        return s->send_json(200, model_card());
      }
      if (path == "/v1/chat/completions" || path == "/v1/completions") {
        if (!post) throw ApiError(405, "use POST");
        return generate(s, req, path, arrival);
      }
      throw ApiError(
          404, fmt::format("no route {} {}", printable(std::string(req.method_string())), printable(path)));
    } catch (...) {
      reply_error(s, path);
    }
  }

  json model_card() const {
    return {{"id", cfg_.served_model_name},
            {"object", "model"},
            {"created", 0},
            {"owned_by", "dsaserve"},
            {"max_model_len", context_}};
  }

  // Inside a catch: answers `path` on `s` with the exception in flight (an ApiError's status and body, else
  // a 500) and counts it.
  void reply_error(const std::shared_ptr<Session>& s, const std::string& path) {
    try {
      throw;
    } catch (const ApiError& e) {
      metrics_.request_done(path, e.status);
      s->send_json(e.status, e.body());
    } catch (const std::exception& e) {
      metrics_.request_done(path, 500);
      s->send_json(500, ApiError(500, printable(e.what()), "", "server_error").body());
    } catch (...) {
      metrics_.request_done(path, 500);
      s->send_json(500, ApiError(500, "internal error", "", "server_error").body());
    }
  }

  // A generation request: admitted on the I/O thread (draining and overload checks), prepared on the
  // preparation pool (JSON, chat template, tokenization, limits, grammar compilation: the costly part,
  // kept off the thread that serves every other connection), then started back on the I/O thread.
  void generate(const std::shared_ptr<Session>& s, const http::request<http::string_body>& req,
                const std::string& path, std::chrono::steady_clock::time_point arrival) {
    if (draining_) throw ApiError(503, "the server is shutting down", "", "server_error");
    if (ctx_.active_jobs + preparing_ >=
        cfg_.engine.scheduler.max_running_requests + cfg_.max_queued_requests) {
      throw ApiError(
          503, fmt::format("the server is overloaded ({} requests in flight)", ctx_.active_jobs + preparing_),
          "", "server_error");
    }
    ++preparing_;
    net::post(prep_pool_, [this, s, body = req.body(), path, arrival] {
      std::shared_ptr<Prepared> prep;
      std::optional<ApiError> api_error;
      std::string internal_error;
      try {
        prep = std::make_shared<Prepared>(prepare(body, path == "/v1/chat/completions"));
      } catch (const ApiError& e) {
        api_error = e;
      } catch (const std::exception& e) {
        internal_error = printable(e.what());
      } catch (...) {
        internal_error = "unknown error while preparing the request";
      }
      net::post(ioc_, [this, s, path, arrival, prep, api_error, internal_error] {
        --preparing_;
        try {
          if (api_error) throw *api_error;
          if (!prep) throw ApiError(500, internal_error, "", "server_error");
          if (draining_) throw ApiError(503, "the server is shutting down", "", "server_error");
          auto job = std::make_shared<Job>(ctx_, std::move(prep->spec), std::move(prep->prompt),
                                           std::move(prep->prompt_text), s, path, arrival);
          s->set_job(job);
          job->start();
        } catch (...) {
          reply_error(s, path);
        }
      });
    });
  }

  // A constrained request's schema or tools become a grammar, whose compilation grows faster than linearly
  // with their size (xgrammar: ~3 s for one object of 2,000 properties, ~4 s for 1,600 tools; roughly the
  // square of a literal's length: a 10,000-character const 0.2 s, 80,000 6.7 s, 1,000,000 over a minute, on
  // the preparation pool, which SIGTERM waits for): bounded. The literals' bytes as OpenAI's structured
  // outputs bound an enum's (15,000 characters).
  static void check_grammar_source(const GenerationSpec& spec) {
    static constexpr int64_t kMaxValues = 4096, kMaxKeys = 512, kMaxLiteralBytes = 16384,
                             kMaxPatternSize = 2048;
    const bool forced_call =
        spec.chat && spec.has_tools && spec.tool_choice != "auto" && spec.tool_choice != "none";
    const bool schema = spec.response_format == "json_schema";
    if (!forced_call && !schema) return;
    const JsonShape shape = json_shape(forced_call ? spec.chat_request.at("tools") : spec.response_schema);
    const char* param = forced_call ? "tools" : "response_format.json_schema.schema";
    if (shape.values > kMaxValues || shape.max_object_keys > kMaxKeys) {
      throw ApiError(400,
                     fmt::format("{} has {} JSON values and an object of {} keys; a grammar-constrained "
                                 "request allows at most {} values and {} keys per object",
                                 param, shape.values, shape.max_object_keys, kMaxValues, kMaxKeys),
                     param);
    }
    if (shape.literal_bytes > kMaxLiteralBytes) {
      throw ApiError(400,
                     fmt::format("{} spells {} bytes of names and string values (descriptions and titles "
                                 "aside); a grammar-constrained request allows at most {}",
                                 param, shape.literal_bytes, kMaxLiteralBytes),
                     param);
    }
    if (shape.pattern_size > kMaxPatternSize) {
      throw ApiError(
          400,
          fmt::format("{} has a pattern of {} atoms once its counted repetitions ({{n}}, {{n,m}}) are "
                      "written out; a grammar-constrained request allows at most {}",
                      param,
                      // regex_expanded_size saturates: past 10^15 the count is only "very many"
                      shape.pattern_size > int64_t(1e15) ? std::string("more than 10^15")
                                                         : std::to_string(shape.pattern_size),
                      kMaxPatternSize),
          param);
    }
  }

  void check_stopping() const {
    if (stopping_) throw ApiError(503, "the server is shutting down", "", "server_error");
  }

  struct Prepared {
    GenerationSpec spec;
    std::vector<int32_t> prompt;
    std::string prompt_text;
  };

  // Everything a request needs before the engine sees it; throws ApiError for bad input. Runs on the
  // preparation pool: reads only what is immutable while serving (the tokenizer, templates, the grammar
  // backend, which is thread-safe, the limits).
  Prepared prepare(const std::string& raw, bool chat) const {
    // Key order kept (tools and schemas reach the template and grammar as sent); time linear in the body;
    // nesting bounded (the request's values are copied and walked recursively afterwards: templates,
    // schemas, the grammar compiler), and keys and values too.
    const nlohmann::ordered_json body = parse_json_body(raw, JsonLimits{}, &stopping_);
    const int64_t vocab = model_->config().vocab_size;
    GenerationSpec spec = chat ? parse_chat_request(body, vocab, cfg_.max_n)
                               : parse_completion_request(body, vocab, cfg_.max_n);
    if (!spec.model.empty() && spec.model != cfg_.served_model_name) {
      throw ApiError(404,
                     fmt::format("The model '{}' does not exist (this server serves '{}')", spec.model,
                                 cfg_.served_model_name),
                     "model", "invalid_request_error", "model_not_found");
    }
    check_grammar_source(spec);
    std::vector<int32_t> prompt;
    std::string prompt_text;
    check_stopping();
    if (chat) {
      const bool tools_template = spec.has_tools && chat_tools_;
      const auto& tmpl = tools_template ? chat_tools_ : chat_;
      if (!tmpl) throw ApiError(400, "this model has no chat template: use /v1/completions", "messages");
      fit_tool_call_form(spec, tools_template ? chat_tools_form_ : chat_form_);
      try {
        prompt_text = tmpl->render(spec.chat_request);
      } catch (const std::exception& e) {
        throw ApiError(400, fmt::format("the chat template failed on these messages: {}", e.what()),
                       "messages");
      }
      if (spec.continue_final_text) {
        try {
          prompt_text = chat::cut_after_final_message(prompt_text, *spec.continue_final_text);
        } catch (const std::exception& e) {
          throw ApiError(400, e.what(), "continue_final_message");
        }
      }
    } else if (spec.prompt_text) {
      prompt_text = *spec.prompt_text;
    } else {
      prompt = spec.prompt_ids;
    }
    check_stopping();
    if (prompt.empty()) {
      try {
        for (uint32_t id : tok_.encode(prompt_text)) prompt.push_back(int32_t(id));
      } catch (const std::exception& e) {
        throw ApiError(400, fmt::format("cannot tokenize the prompt: {}", e.what()),
                       chat ? "messages" : "prompt");
      }
    }
    const char* prompt_param = chat ? "messages" : "prompt";
    if (prompt.empty()) throw ApiError(400, "the prompt is empty", prompt_param);
    if (int64_t(prompt.size()) > max_prompt_) {
      throw ApiError(
          400, fmt::format("the prompt has {} tokens, more than the limit of {}", prompt.size(), max_prompt_),
          prompt_param, "invalid_request_error", "context_length_exceeded");
    }
    const int64_t room = context_ - int64_t(prompt.size());
    if (spec.max_tokens_given && spec.params.max_new_tokens > room) {
      throw ApiError(400,
                     fmt::format("the prompt ({} tokens) plus max_tokens ({}) exceed the context length {}",
                                 prompt.size(), spec.params.max_new_tokens, context_),
                     "max_tokens", "invalid_request_error", "context_length_exceeded");
    }
    if (!spec.max_tokens_given) spec.params.max_new_tokens = chat ? room : std::min<int64_t>(16, room);
    // A request must fit its DP group's KV pool alone: as SGLang, its output is capped at what the pool holds
    // after the prompt (less a page, for speculative drafts), so it ends with "length" there instead of
    // failing after it has run ("needs more than the pool").
    const int64_t pool_room = pool_tokens_ - int64_t(prompt.size());
    if (pool_tokens_ > 0 && pool_room >= 1 && spec.params.max_new_tokens > pool_room)
      spec.params.max_new_tokens = pool_room;
    check_stopping();
    spec.grammar = request_grammar(grammar_.get(), spec, ctx_.tool_format, ctx_.reasoning, prompt_text);
    return Prepared{std::move(spec), std::move(prompt), std::move(prompt_text)};
  }

  ServerConfig cfg_;
  std::shared_ptr<model::Model> model_;
  tokenizer::Tokenizer tok_;
  std::optional<chat::ChatTemplate> chat_, chat_tools_;
  chat::ToolCallForm chat_form_, chat_tools_form_;  // how each template reads a turn of tool calls
  net::io_context ioc_{1};
  tcp::acceptor acceptor_;
  net::signal_set signals_;
  net::steady_timer drain_timer_;
  std::unique_ptr<grammar::GrammarBackend> grammar_;
  std::unique_ptr<runtime::EngineFront> engine_;
  ServerMetrics metrics_;
  ServingContext ctx_;
  Router router_;
  std::thread pump_;
  std::atomic<bool> pump_stop_{false};
  bool draining_ = false;
  std::chrono::steady_clock::time_point drain_start_;
  int64_t context_ = 0;
  int64_t pool_tokens_ = 0;  // tokens one request may hold in its DP group's KV pool (less a page)
  int64_t max_prompt_ = 0;
  int64_t preparing_ = 0;    // requests on the preparation pool (I/O thread only)
  int64_t open_writes_ = 0;  // sessions with a write under way (I/O thread only)
  int64_t accept_backoff_ms_ = 0;
  net::steady_timer accept_timer_{ioc_};
  std::chrono::steady_clock::time_point flush_until_;
  // Set when the server stops: preparations under way give up at their next check.
  std::atomic<bool> stopping_{false};
  // Last member: destroyed (stopped and joined) first, before anything its tasks read.
  net::thread_pool prep_pool_{kPrepThreads};
};

}  // namespace

trace::Recorder::Annotator trace_plan_annotator(const ServerConfig& cfg, const model::ModelConfig& mc) {
  // Each trace file's "plan_summary": its op spans' time next to the plan's roofline for the same
  // batches (plan/trace_summary.h). A model the planner cannot price says why there instead.
  // With --tp: a rank's ops are its shard's, the collectives those of the deployment that ran.
  plan::TraceSummaryOptions po;
  if (cfg.engine.ranks) {
    const dist::ParallelLayout& l = cfg.engine.ranks->layout();
    po.deployment.tp = l.tp;
    po.deployment.ep_size = l.ep_size;
    po.deployment.attn_dp_size = l.attn_dp_size;
    po.deployment.moe_dense_tp_size = l.moe_dense_tp_size;
    po.deployment.dsa_topk_broadcast = cfg.engine.forward.dsa_topk_broadcast;
    if (cfg.engine.forward.moe_a2a_deepep) po.deployment.moe_a2a_backend = plan::A2aBackend::deepep;
    po.deployment.deepep_fp8_dispatch = cfg.engine.forward.deepep_fp8_dispatch;
    po.what_if = po.deployment;
  }
  return [mc, po](const std::vector<trace::Event>& ev, nlohmann::json& j) {
    try {
      j["plan_summary"] = plan::measured_vs_planned(ev, mc, po);
    } catch (const std::exception& e) {
      j["plan_summary"] = {{"error", e.what()}};
    }
  };
}

int run_server(const ServerConfig& in) {
  ServerConfig cfg = in;
  static const char* kReasoningParsers[] = {"deepseek-r1", "deepseek-v3", "glm45", "qwen3", "kimi"};
  if (!cfg.reasoning_parser.empty()) {
    bool known = false;
    for (const char* n : kReasoningParsers) known = known || cfg.reasoning_parser == n;
    DSA_CHECK(known, "--reasoning-parser '{}': expected one of deepseek-r1, deepseek-v3, glm45, qwen3, kimi",
              cfg.reasoning_parser);
  }
  tool_format(cfg.tool_call_parser);  // throws on an unknown name before loading anything
  const Device device = runtime::parse_device(cfg.device);
  DSA_CHECK(cfg.sampling_device == "cpu" || cfg.sampling_device == "gpu",
            "--sampling-device '{}': expected cpu or gpu", cfg.sampling_device);
  DSA_CHECK(cfg.sampling_device == "cpu" || device == Device::cuda,
            "--sampling-device gpu needs --device cuda (the logits are sampled where the model runs)");
  cfg.engine.sample_on_device = cfg.sampling_device == "gpu";
  runtime::use_device(device);  // "no CUDA device" before loading anything
  const auto t0 = std::chrono::steady_clock::now();
  // Model.
  std::shared_ptr<model::Model> model;
  std::filesystem::path model_dir;
  const std::string& model_path = cfg.model.model;
  if (is_builtin_model(model_path)) {
    const auto dir = std::filesystem::temp_directory_path() / fmt::format("dsaserve-builtin-{}", ::getpid());
    model = make_builtin_model(dir, cfg.builtin_seed);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);                                   // the weights stay mapped
    if (cfg.served_model_name.empty()) cfg.served_model_name = model_path;  // builtin:demo or builtin
  } else {
    DSA_CHECK(!model_path.empty(), "--model is required (a model folder, or builtin:demo)");
    // A folder, or a config file (dummy weights): its folder holds the tokenizer and generation config.
    model_dir = std::filesystem::is_directory(model_path)
                    ? std::filesystem::path(model_path)
                    : std::filesystem::absolute(model_path).parent_path();
    // Dummy weights are generated on the device directly; a checkpoint is bound on the host.
    model = model::load_model(cfg.model, device, cfg.engine.speculative.enabled());
    if (cfg.served_model_name.empty())
      cfg.served_model_name = std::filesystem::absolute(model_path).filename().string();
  }
  // The weights on the device (dtypes kept); the engine's KV cache follows them.
  const model::KvCacheDtype kv_dtype =
      runtime::resolve_kv_cache_dtype(cfg.kv_cache_dtype, device, model->config());
  cfg.engine.kv_dtype = kv_dtype;
  // --tp N: rank 0's shard only (runtime/ranks: the other ranks hold theirs and follow its steps).
  if (cfg.engine.ranks && cfg.engine.ranks->world_size() > 1)
    model = model->sharded(cfg.engine.ranks->shard());
  const auto t_loaded = std::chrono::steady_clock::now();
  model = runtime::model_on_device(std::move(model), device, cfg.kernels, kv_dtype);
  const auto t_uploaded = std::chrono::steady_clock::now();
  const runtime::DeviceMemory after_weights = runtime::device_memory(device);
  // Tokenizer and chat template.
  std::string tok_path = cfg.tokenizer_path;
  if (tok_path.empty()) {
    if (is_builtin_model(model_path)) {
      tok_path = "builtin:bytes";
    } else if (cfg.model.dummy() && !std::filesystem::exists(model_dir / "tokenizer.json")) {
      // Random weights and no tokenizer beside the config: the byte-level one (any text is a few ids).
      tok_path = "builtin:bytes";
      fmt::print(
          "dsaserve serve: {} has no tokenizer.json: dummy weights served with --tokenizer builtin:bytes\n",
          model_dir.string());
    } else {
      DSA_CHECK(std::filesystem::exists(model_dir / "tokenizer.json"),
                "{} has no tokenizer.json: pass --tokenizer DIR or --tokenizer builtin:bytes",
                model_dir.string());
      tok_path = model_dir.string();
    }
  }
  std::optional<tokenizer::Tokenizer> tok;
  std::optional<chat::ChatTemplate> chat_tmpl, chat_tools;
  std::vector<int32_t> eos;
  if (model->config().eos_token_id) eos.push_back(int32_t(*model->config().eos_token_id));
  if (tok_path == "builtin:bytes") {
    tok.emplace(make_builtin_tokenizer());
    const nlohmann::ordered_json special = {{"bos_token", kBuiltinBos}, {"eos_token", kBuiltinEos}};
    chat_tmpl.emplace(
        cfg.chat_template_path.empty() ? builtin_chat_template() : read_text(cfg.chat_template_path),
        special);
    eos.push_back(int32_t(*tok->token_to_id(kBuiltinEos)));
  } else {
    tok.emplace(tokenizer::Tokenizer::from_file(tok_path));
    const std::filesystem::path tdir = std::filesystem::is_directory(tok_path)
                                           ? std::filesystem::path(tok_path)
                                           : std::filesystem::path(tok_path).parent_path();
    if (std::filesystem::exists(tdir / "tokenizer_config.json")) {
      const chat::ChatConfig cc = chat::ChatConfig::load(tdir);
      if (!cc.templates.empty()) {
        chat_tmpl.emplace(chat::ChatTemplate::from_config(cc, false));
        if (cc.templates.count("tool_use")) chat_tools.emplace(chat::ChatTemplate::from_config(cc, true));
      }
      if (!cc.eos_token.empty()) {
        if (auto id = tok->token_to_id(cc.eos_token)) eos.push_back(int32_t(*id));
      }
    }
    if (!cfg.chat_template_path.empty()) {
      const chat::ChatConfig cc = std::filesystem::exists(tdir / "tokenizer_config.json")
                                      ? chat::ChatConfig::load(tdir)
                                      : chat::ChatConfig{};
      chat_tmpl.emplace(read_text(cfg.chat_template_path), cc.special_tokens());
      chat_tools.reset();
    }
  }
  // generation_config.json's eos ids (an int or a list), like transformers.
  if (!model_dir.empty() && std::filesystem::exists(model_dir / "generation_config.json")) {
    const auto g = nlohmann::json::parse(read_text(model_dir / "generation_config.json"), nullptr, false);
    if (g.is_object() && g.contains("eos_token_id")) {
      const auto& e = g["eos_token_id"];
      if (e.is_number_integer()) eos.push_back(e.get<int32_t>());
      if (e.is_array()) {
        for (const auto& x : e) {
          if (x.is_number_integer()) eos.push_back(x.get<int32_t>());
        }
      }
    }
  }
  cfg.engine.scheduler.eos_token_ids = eos;
  // Warm-up (CUDA): kernel loading, cuBLASLt heuristics and allocator growth before the first request;
  // its cached blocks go back to the device, so the free memory measured next is what steps can use.
  const double warm_s =
      device == Device::cuda ? runtime::warm_up(*model, kv_dtype, 64, cfg.engine.forward) : 0.0;
  runtime::release_cached_memory(device);
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  const int64_t weight_bytes = model->weights().bytes();
  const double weight_gib = double(weight_bytes) / kGiB;
  const double page_bytes =
      double(model::KvCache::bytes_per_token(model->config(), model->num_mtp_layers() > 0, kv_dtype) *
             cfg.engine.page_size);
  const int64_t model_ctx = model->config().max_position_embeddings;
  cfg.engine.scheduler.max_context =
      cfg.context_length > 0 ? std::min(cfg.context_length, model_ctx > 0 ? model_ctx : cfg.context_length)
                             : model_ctx;
  // --kv-pages: N; 0: from --mem-fraction-static; unset (-1): 512 pages on the CPU, on CUDA what the
  // device has free after the weights, less the activation workspace a step can hold and a reserve.
  if (cfg.engine.kv_pages < 0 && device == Device::cpu) cfg.engine.kv_pages = 512;
  if (cfg.engine.kv_pages <= 0) {
    const bool fraction = cfg.engine.kv_pages == 0 || cfg.mem_fraction_static > 0;
    if (fraction) {
      DSA_CHECK(cfg.mem_fraction_static > 0 && cfg.mem_fraction_static < 1,
                "--mem-fraction-static must be in (0, 1) with --kv-pages 0, got {}", cfg.mem_fraction_static);
    }
    const runtime::DeviceMemory mem = runtime::device_memory(device);
    double kv_bytes = 0;
    if (device == Device::cpu) {
      kv_bytes = cfg.mem_fraction_static * double(mem.total) - double(weight_bytes);
    } else {
      const auto& sc = cfg.engine.scheduler;
      runtime::StepLimits lim;
      lim.max_running_requests = sc.max_running_requests;
      lim.max_prefill_tokens = sc.max_prefill_tokens;
      lim.chunked_prefill_size = sc.chunked_prefill_size;
      lim.max_context = sc.max_context;
      runtime::GraphSupport gs =
          runtime::graph_support(*model, kv_dtype, cfg.engine.forward, cfg.engine.cuda_graph_max_bs,
                                 sc.max_running_requests, runtime::cuda_graphs_built());
      if (cfg.engine.speculative.enabled()) {  // verify / draft graphs (the engine's rule)
        lim.speculative_num_steps = cfg.engine.speculative.num_steps;
        gs.tokens = cfg.engine.speculative.verify_rows();
      }
      lim.cuda_graph_max_bs = runtime::cuda_graph_max_batch(gs);
      lim.forward = cfg.engine.forward;
      const runtime::WorkspaceEstimate ws = runtime::estimate_workspace(model->config(), lim);
      const runtime::MemorySplit split =
          runtime::split_memory(weight_bytes, after_weights.free, mem.free, mem.total, ws.total(),
                                fraction ? cfg.mem_fraction_static : 0.0);
      kv_bytes = double(split.kv_bytes);
      fmt::print(
          "dsaserve serve: device memory {:.2f} GiB; weights {:.2f} GiB; free after the weights {:.2f} GiB, "
          "after warm-up {:.2f} GiB; activation workspace {}; {}KV pool {:.2f} GiB = {:.1f}% of the memory "
          "free after the weights\n",
          double(mem.total) / kGiB, weight_gib, double(split.free_after_weights) / kGiB,
          double(split.free_now) / kGiB, ws.describe(),
          fraction ? fmt::format("--mem-fraction-static {} x free - workspace: ", cfg.mem_fraction_static)
                   : fmt::format("reserve {:.2f} GiB; ", double(split.reserve) / kGiB),
          kv_bytes / kGiB, 100.0 * split.kv_share());
      DSA_CHECK(split.kv_bytes > 0,
                "the device has {:.2f} GiB free after the weights and warm-up, less than the {:.2f} GiB a "
                "step can hold ({}); lower --max-prefill-tokens, --chunked-prefill-size or "
                "--max-running-requests, or give --kv-pages",
                double(mem.free) / kGiB, double(ws.total()) / kGiB, ws.describe());
    }
    cfg.engine.kv_pages = int64_t(kv_bytes / page_bytes);
    DSA_CHECK(cfg.engine.kv_pages > 0, "--mem-fraction-static {} leaves no memory for the KV cache",
              cfg.mem_fraction_static);
  }
  fmt::print(
      "dsaserve serve: device {} ({}); weights {:.3f} GiB; KV cache {}: {} pages of {} tokens = {} tokens "
      "({:.3f} GiB)\n",
      device_name(device), runtime::device_description(device), weight_gib,
      runtime::kv_cache_dtype_name(kv_dtype), cfg.engine.kv_pages, cfg.engine.page_size,
      cfg.engine.kv_pages * cfg.engine.page_size, double(cfg.engine.kv_pages) * page_bytes / kGiB);
  if (device == Device::cuda) fmt::print("dsaserve serve: kernels {}\n", kernels::describe(cfg.kernels));
  std::fflush(stdout);
  if (int64_t(tok->vocab_size()) > model->config().vocab_size) {
    fmt::print(stderr, "dsaserve serve: warning: the tokenizer has {} ids, the model's vocabulary {}\n",
               tok->vocab_size(), model->config().vocab_size);
  }
  // --trace-dir: a recorder for the engine's phases and the model's spans (every thread), flushed by the
  // engine every trace_flush_steps steps and here once the server has stopped.
  std::optional<trace::Recorder> recorder;
  struct Uninstall {
    bool on = false;
    ~Uninstall() {
      if (on) trace::set_active(nullptr);
    }
  } uninstall;
  if (!cfg.engine.trace_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(cfg.engine.trace_dir, ec);
    DSA_CHECK(!ec, "--trace-dir {}: cannot create it: {}", cfg.engine.trace_dir, ec.message());
    DSA_CHECK(cfg.trace_max_events > 0, "--trace-max-events must be positive, got {}", cfg.trace_max_events);
    recorder.emplace();
    recorder->set_max_events(size_t(cfg.trace_max_events));
    recorder->set_annotator(trace_plan_annotator(cfg, model->config()));
    trace::set_active(&*recorder);
    uninstall.on = true;
  }
  int rc = 0;
  {
    const auto t_kv = std::chrono::steady_clock::now();
    Server server(cfg, std::move(model), std::move(*tok), std::move(chat_tmpl), std::move(chat_tools));
    const auto t_ready = std::chrono::steady_clock::now();
    const auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    const runtime::EngineStats es = server.engine_stats();
    fmt::print(
        "dsaserve serve: loaded in {:.2f} s (load {:.2f} s, upload {:.2f} s, warm-up {:.2f} s, "
        "KV alloc {:.2f} s, CUDA graphs {:.2f} s: {} captured)\n",
        secs(t0, t_ready), secs(t0, t_loaded), secs(t_loaded, t_uploaded), warm_s,
        secs(t_kv, t_ready) - es.cuda_graph_seconds, es.cuda_graph_seconds, es.cuda_graphs);
    rc = server.run();
  }  // the engine has stopped: nothing records any more
  if (recorder) {
    trace::set_active(nullptr);
    uninstall.on = false;
    const int64_t dropped = recorder->dropped();
    const auto path = recorder->flush(cfg.engine.trace_dir);
    fmt::print("dsaserve serve: trace -> {}{}\n", path.string(),
               dropped > 0 ? fmt::format(" ({} events dropped over --trace-max-events)", dropped) : "");
    std::fflush(stdout);
  }
  return rc;
}

}  // namespace dsaserve::server
