#pragma once
// Job: one /v1/chat/completions or /v1/completions request on its way back. It submits n engine
// requests, and for each engine output (in order, on the server's I/O thread) detokenizes incrementally,
// applies stop strings (holding back partial matches), collects logprobs, and writes SSE chunks or the
// final JSON to its ResponseSink. A client that goes away cancels the job: its engine requests are
// aborted and their pages freed at the engine's next step.
#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "chat/output_parser.h"
#include "grammar/grammar.h"
#include "runtime/engine/engine.h"
#include "runtime/ranks/front.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/stop_matcher.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace dsaserve::server {

// Where a job writes (the HTTP session). Calls come from the I/O thread.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  virtual void send_json(int status, const nlohmann::json& body) = 0;
  // A whole response body as it is (JSON whose key order must be kept: ordered_json dumps).
  virtual void send(int status, std::string body, const std::string& content_type) = 0;
  virtual void stream_begin() = 0;
  virtual void stream_event(const std::string& data) = 0;  // one "data: ..." SSE event
  virtual void stream_end() = 0;
  // Called once when the job has written everything.
  virtual void job_done() = 0;
};

class Job;

// How a token is spelled in logprobs: `bytes`, what it contributes to the text (raw, possibly a part of a
// UTF-8 character), and `text`, those bytes when they are valid UTF-8, else OpenAI's "bytes:\\xe2\\x80".
struct TokenText {
  std::string text;
  std::string bytes;
};
TokenText token_text(const tokenizer::Tokenizer& tok, int32_t id);

// A /v1/completions top_logprobs entry: {token text: logprob} in rank order (most likely first), with
// the chosen token added last when it is not among `top` (so `logprobs: 0` gives just the chosen one,
// as vLLM). Two tokens with the same text keep the higher-ranked one.
nlohmann::ordered_json completion_top_logprobs(const tokenizer::Tokenizer& tok, int32_t chosen,
                                               float chosen_logprob,
                                               std::span<const runtime::TokenLogprob> top);

// What jobs share; owned by the server, used on the I/O thread only (the engine is thread-safe).
struct ServingContext {
  runtime::EngineFront* engine = nullptr;  // the engine, or the DP controller (runtime/ranks/front.h)
  const tokenizer::Tokenizer* tokenizer = nullptr;
  ServerMetrics* metrics = nullptr;
  std::string model_name;
  // --reasoning-parser / --tool-call-parser (chat requests only; tools only when the request has some).
  bool reasoning = false;
  chat::ToolCallFormat tool_format = chat::ToolCallFormat::kNone;
  // Grammar-constrained decoding (null when unavailable): a matcher per choice of a constrained job.
  grammar::GrammarBackend* grammar = nullptr;
  std::unordered_map<uint64_t, std::weak_ptr<Job>> routes;  // engine request id -> job
  uint64_t next_engine_id = 1;
  int64_t active_jobs = 0;
};

class Job : public std::enable_shared_from_this<Job> {
 public:
  using Clock = std::chrono::steady_clock;
  Job(ServingContext& ctx, GenerationSpec spec, std::vector<int32_t> prompt, std::string prompt_text,
      std::shared_ptr<ResponseSink> sink, std::string endpoint, Clock::time_point arrival);
  ~Job();

  void start();
  void on_output(const runtime::StepOutput& o);
  // The client went away: abort what is still generating; nothing more is written.
  void cancel();
  // Ends the job with an error (engine error, server shutdown): aborts what is still generating; a
  // stream gets an OpenAI error object as an event, then [DONE]; otherwise the error is the response.
  void fail(const ApiError& e);
  bool finished() const { return finished_; }

 private:
  struct Choice {
    uint64_t engine_id = 0;
    std::optional<tokenizer::DecodeStream> detok;
    StopMatcher stop;
    std::string text;
    std::optional<chat::OutputParser> parser;  // reasoning / tool calls (chat)
    chat::ParsedMessage parsed;
    std::vector<int32_t> token_ids;
    nlohmann::ordered_json logprobs = nlohmann::ordered_json::array();  // entries not yet streamed (or all)
    int64_t tokens = 0;
    int64_t text_offset = 0;
    // /v1/completions echo: the prompt's logprobs entries (the first token's logprob null) and whether
    // the echoed prompt was streamed.
    nlohmann::ordered_json prompt_logprobs = nlohmann::ordered_json::array();
    int64_t prompt_offset = 0;
    bool echo_sent = false;
    // A forced call's deltas not sent yet: a call is sent once its closing tag is written.
    std::vector<chat::ToolCallDelta> held_calls;
    bool done = false;
    bool engine_done = false;
    bool role_sent = false;
    // Speculative decoding: the request's verify rounds and the drafts they accepted (the engine's
    // running counts: the latest output's).
    int64_t spec_verify_ct = 0;
    int64_t spec_accepted_drafts = 0;
    std::string finish_reason;
    std::string error;
    Clock::time_point last_token;
  };
  void add_logprob(Choice& c, const runtime::StepOutput& o);
  void add_prompt_logprobs(Choice& c, const runtime::StepOutput& o);
  bool echo() const { return spec_.echo && !spec_.chat; }
  // tool_choice "required" / a named function under the grammar: calls are sent whole (when closed), so
  // one cut by max_tokens is never sent (finish_reason "length", the closed calls only, no content).
  bool forced_calls() const;
  void hold_unclosed_calls(Choice& c, chat::OutputDelta& delta, bool final) const;
  void emit(Choice& c, size_t index, const std::string& text, bool final);
  void complete();
  nlohmann::ordered_json usage() const;
  nlohmann::ordered_json chunk_base() const;

  ServingContext& ctx_;
  GenerationSpec spec_;
  std::vector<int32_t> prompt_;
  std::string prompt_text_;
  std::string echo_text_;  // the prompt as echoed (completions with echo; token-id prompts decoded)
  std::shared_ptr<ResponseSink> sink_;
  std::string endpoint_;
  Clock::time_point arrival_;
  std::string id_;
  int64_t created_ = 0;
  std::vector<Choice> choices_;
  int64_t prompt_tokens_ = 0;
  int64_t cached_tokens_ = 0;
  bool first_token_seen_ = false;
  bool cancelled_ = false;
  bool finished_ = false;
};

}  // namespace dsaserve::server
