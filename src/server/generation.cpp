#include "server/generation.h"

#include <fmt/format.h>

#include <random>

#include "server/json_body.h"
#include "tokenizer/utf8.h"

namespace dsaserve::server {

using json = nlohmann::ordered_json;

namespace {
std::string random_hex() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{:016x}", rng());
}
double seconds(Job::Clock::duration d) { return std::chrono::duration<double>(d).count(); }

json byte_array(std::string_view s) {
  json a = json::array();
  for (unsigned char c : s) a.push_back(int(c));
  return a;
}
}  // namespace

TokenText token_text(const tokenizer::Tokenizer& tok, int32_t id) {
  TokenText t;
  const uint32_t u = uint32_t(id);
  t.bytes = tok.bytewise_decoding() ? std::string(tok.token_bytes(u, false))
                                    : tok.decode(std::span<const uint32_t>(&u, 1));
  if (tokenizer::utf8_valid_prefix(t.bytes) == t.bytes.size()) {
    t.text = t.bytes;
  } else {  // OpenAI's spelling of a token that is not valid UTF-8 on its own
    t.text = "bytes:";
    for (unsigned char c : t.bytes) t.text += fmt::format("\\x{:02x}", c);
  }
  return t;
}

json completion_top_logprobs(const tokenizer::Tokenizer& tok, int32_t chosen, float chosen_logprob,
                             std::span<const runtime::TokenLogprob> top) {
  json d = json::object();
  bool has_chosen = false;
  for (const runtime::TokenLogprob& x : top) {
    std::string key = token_text(tok, x.token).text;
    if (!d.contains(key)) d[std::move(key)] = x.logprob;  // a collision keeps the higher-ranked entry
    has_chosen = has_chosen || x.token == chosen;
  }
  if (!has_chosen) {
    std::string key = token_text(tok, chosen).text;
    if (!d.contains(key)) d[std::move(key)] = chosen_logprob;
  }
  return d;
}

Job::Job(ServingContext& ctx, GenerationSpec spec, std::vector<int32_t> prompt, std::string prompt_text,
         std::shared_ptr<ResponseSink> sink, std::string endpoint, Clock::time_point arrival)
    : ctx_(ctx),
      spec_(std::move(spec)),
      prompt_(std::move(prompt)),
      prompt_text_(std::move(prompt_text)),
      sink_(std::move(sink)),
      endpoint_(std::move(endpoint)),
      arrival_(arrival) {
  id_ = (spec_.chat ? "chatcmpl-" : "cmpl-") + random_hex();
  created_ =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  prompt_tokens_ = int64_t(prompt_.size());
}

Job::~Job() = default;

void Job::start() {
  ++ctx_.active_jobs;
  choices_.resize(size_t(spec_.n));
  if (echo()) {
    if (spec_.prompt_text) {
      echo_text_ = prompt_text_;
    } else {
      const std::vector<uint32_t> ids(prompt_.begin(), prompt_.end());
      echo_text_ = ctx_.tokenizer->decode(ids);
    }
  }
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    if (echo()) {
      c.text_offset = int64_t(echo_text_.size());  // completion offsets count the echoed prompt
      if (spec_.params.logprobs && !prompt_.empty()) {
        const TokenText t = token_text(*ctx_.tokenizer, prompt_[0]);
        c.prompt_logprobs.push_back(
            {{"token", t.text}, {"logprob", nullptr}, {"top", nullptr}, {"offset", 0}});
        c.prompt_offset = int64_t(t.bytes.size());
      }
    }
    c.engine_id = ctx_.next_engine_id++;
    c.detok.emplace(*ctx_.tokenizer, spec_.skip_special_tokens);
    c.stop = StopMatcher(spec_.stop);
    const bool tools =
        spec_.has_tools && spec_.tool_choice != "none" && ctx_.tool_format != chat::ToolCallFormat::kNone;
    if (spec_.chat && (ctx_.reasoning || tools)) {
      chat::OutputParserOptions po;
      po.reasoning = ctx_.reasoning;
      po.start_in_reasoning = ctx_.reasoning && chat::prompt_opens_reasoning(prompt_text_);
      if (tools) {
        po.tool_format = ctx_.tool_format;
        po.tools = spec_.parser_tools;
      }
      c.parser.emplace(std::move(po));
    }
    ctx_.routes[c.engine_id] = weak_from_this();
  }
  if (spec_.stream) sink_->stream_begin();
  for (size_t i = 0; i < choices_.size(); ++i) {
    runtime::GenerateRequest g;
    g.id = choices_[i].engine_id;
    g.prompt = prompt_;
    g.params = spec_.params;
    if (echo() && spec_.params.logprobs) g.params.prompt_logprobs = spec_.params.top_logprobs;
    if (g.params.seed) g.params.seed = *g.params.seed + i;  // n > 1: different but reproducible choices
    if (spec_.grammar != nullptr && ctx_.grammar != nullptr)
      g.params.constraint = ctx_.grammar->make_constraint(spec_.grammar);
    ctx_.engine->submit(std::move(g));
  }
}

void Job::cancel() {
  if (finished_) return;
  cancelled_ = true;
  ctx_.metrics->request_aborted(endpoint_);
  for (Choice& c : choices_) {
    if (!c.engine_done) ctx_.engine->abort(c.engine_id);
    c.done = true;
  }
  complete();
}

void Job::fail(const ApiError& e) {
  if (finished_) return;
  for (Choice& x : choices_) {
    if (!x.engine_done) ctx_.engine->abort(x.engine_id);
    x.done = true;
  }
  if (!cancelled_) {
    if (spec_.stream) {
      sink_->stream_event(dump_json(e.body()));
    } else {
      cancelled_ = true;  // nothing more is written
      ctx_.metrics->request_done(endpoint_, e.status);
      sink_->send_json(e.status, e.body());
    }
  }
  complete();
}

void Job::add_logprob(Choice& c, const runtime::StepOutput& o) {
  const tokenizer::Tokenizer& tok = *ctx_.tokenizer;
  const TokenText t = token_text(tok, o.token);
  if (spec_.chat) {
    json top = json::array();
    for (const auto& x : o.top_logprobs) {
      const TokenText s = token_text(tok, x.token);
      top.push_back({{"token", s.text}, {"logprob", x.logprob}, {"bytes", byte_array(s.bytes)}});
    }
    c.logprobs.push_back(
        {{"token", t.text}, {"logprob", o.logprob}, {"bytes", byte_array(t.bytes)}, {"top_logprobs", top}});
  } else {
    c.logprobs.push_back({{"token", t.text},
                          {"logprob", o.logprob},
                          {"top", completion_top_logprobs(tok, o.token, o.logprob, o.top_logprobs)},
                          {"offset", c.text_offset}});
    c.text_offset += int64_t(t.bytes.size());
  }
}

void Job::add_prompt_logprobs(Choice& c, const runtime::StepOutput& o) {
  const tokenizer::Tokenizer& tok = *ctx_.tokenizer;
  for (size_t k = 0; k < o.prompt_logprobs.size(); ++k) {
    const runtime::SampleResult& e = o.prompt_logprobs[k];
    const TokenText t = token_text(tok, e.token);
    c.prompt_logprobs.push_back({{"token", t.text},
                                 {"logprob", e.logprob},
                                 {"top", completion_top_logprobs(tok, e.token, e.logprob, e.top)},
                                 {"offset", c.prompt_offset}});
    c.prompt_offset += int64_t(t.bytes.size());
  }
}

json Job::chunk_base() const {
  return {{"id", id_},
          {"object", spec_.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created_},
          {"model", ctx_.model_name}};
}

json Job::usage() const {
  int64_t completion = 0, verify = 0, accepted = 0;
  for (const Choice& c : choices_) {
    completion += c.tokens;
    verify += c.spec_verify_ct;
    accepted += c.spec_accepted_drafts;
  }
  json u = {{"prompt_tokens", prompt_tokens_},
            {"completion_tokens", completion},
            {"total_tokens", prompt_tokens_ + completion},
            {"prompt_tokens_details", {{"cached_tokens", cached_tokens_}}}};
  // Extension (SGLang's meta_info names), when speculation ran: verify rounds and their mean accept
  // length (tokens a round yields: accepted drafts + 1).
  if (verify > 0) {
    u["spec_verify_ct"] = verify;
    u["spec_accept_length"] = 1.0 + double(accepted) / double(verify);
  }
  return u;
}

namespace {
json completion_logprobs(const json& entries) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (const json& e : entries) {
    tokens.push_back(e["token"]);
    lps.push_back(e["logprob"]);
    tops.push_back(e["top"]);
    offs.push_back(e["offset"]);
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}
}  // namespace

namespace {
// The tag that closes one call of `f` (the grammar always writes it; the parsers emit a DeepSeek call
// whole when it arrives).
std::string_view call_end_tag(chat::ToolCallFormat f) {
  switch (f) {
    case chat::ToolCallFormat::kGlm45: return "</tool_call>";
    case chat::ToolCallFormat::kDeepSeekV3: return "<｜tool▁call▁end｜>";
    case chat::ToolCallFormat::kDeepSeekV32: return "</｜DSML｜invoke>";
    case chat::ToolCallFormat::kNone: break;
  }
  return {};
}

int64_t count_of(std::string_view s, std::string_view what) {
  int64_t n = 0;
  for (size_t at = s.find(what); !what.empty() && at != std::string_view::npos;
       at = s.find(what, at + what.size()))
    ++n;
  return n;
}
}  // namespace

bool Job::forced_calls() const {
  return spec_.chat && spec_.grammar != nullptr && spec_.has_tools && spec_.tool_choice != "auto" &&
         spec_.tool_choice != "none";
}

void Job::hold_unclosed_calls(Choice& c, chat::OutputDelta& delta, bool final) const {
  // After the reasoning the grammar allows nothing but calls: what a parser returns as content is the
  // markup of a call it could not finish.
  delta.content.clear();
  for (chat::ToolCallDelta& t : delta.tool_calls) c.held_calls.push_back(std::move(t));
  delta.tool_calls.clear();
  const std::string_view end = call_end_tag(ctx_.tool_format);
  const int64_t closed = count_of(c.text, end) - count_of(c.parsed.reasoning_content, end) -
                         count_of(delta.reasoning_content, end);
  size_t k = 0;
  while (k < c.held_calls.size() && c.held_calls[k].index < closed)
    delta.tool_calls.push_back(c.held_calls[k++]);
  c.held_calls.erase(c.held_calls.begin(), c.held_calls.begin() + std::ptrdiff_t(k));
  if (final) c.held_calls.clear();  // cut by max_tokens (or a stop string): the unclosed call is dropped
}

void Job::emit(Choice& c, size_t index, const std::string& text, bool final) {
  c.text += text;
  chat::OutputDelta delta;
  if (c.parser) {
    delta = c.parser->feed(text);
    if (final) delta.append(c.parser->finish());
    if (forced_calls()) hold_unclosed_calls(c, delta, final);
    c.parsed.apply(delta);
    if (final && !c.parsed.tool_calls.empty() && c.finish_reason == "stop") c.finish_reason = "tool_calls";
  } else {
    delta.content = text;
  }
  if (!spec_.stream || cancelled_) return;
  if (echo() && !c.echo_sent) {  // the prompt first, in a chunk of its own
    c.echo_sent = true;
    json ch = {{"index", index},
               {"text", echo_text_},
               {"logprobs", spec_.params.logprobs ? completion_logprobs(c.prompt_logprobs) : json(nullptr)},
               {"finish_reason", nullptr}};
    json chunk = chunk_base();
    chunk["choices"] = json::array({ch});
    if (spec_.include_usage) chunk["usage"] = nullptr;
    sink_->stream_event(chunk.dump());
  }
  if (delta.empty() && !final && c.role_sent) return;
  json ch;
  ch["index"] = index;
  if (spec_.chat) {
    json d = json::object();
    if (!c.role_sent) d["role"] = "assistant";
    if (!delta.content.empty() || !c.role_sent) d["content"] = delta.content;
    if (!delta.reasoning_content.empty()) d["reasoning_content"] = delta.reasoning_content;
    if (!delta.tool_calls.empty()) {
      json calls = json::array();
      for (const chat::ToolCallDelta& t : delta.tool_calls) {
        json call = {{"index", t.index}};
        json fn = {{"arguments", t.arguments}};
        if (!t.id.empty()) {
          call["id"] = t.id;
          call["type"] = "function";
        }
        if (!t.name.empty()) fn["name"] = t.name;
        call["function"] = fn;
        calls.push_back(std::move(call));
      }
      d["tool_calls"] = calls;
    }
    c.role_sent = true;
    ch["delta"] = d;
    ch["logprobs"] =
        spec_.params.logprobs && !c.logprobs.empty() ? json{{"content", c.logprobs}} : json(nullptr);
  } else {
    c.role_sent = true;
    ch["text"] = text;
    ch["logprobs"] =
        spec_.params.logprobs && !c.logprobs.empty() ? completion_logprobs(c.logprobs) : json(nullptr);
  }
  c.logprobs = json::array();
  ch["finish_reason"] = final ? json(c.finish_reason) : json(nullptr);
  json chunk = chunk_base();
  chunk["choices"] = json::array({ch});
  if (spec_.include_usage) chunk["usage"] = nullptr;
  sink_->stream_event(dump_json(chunk));
}

void Job::on_output(const runtime::StepOutput& o) {
  const uint64_t first = choices_.empty() ? 0 : choices_.front().engine_id;
  if (o.id < first || o.id >= first + choices_.size()) return;
  const size_t index = size_t(o.id - first);
  Choice& c = choices_[index];
  if (o.finish != runtime::FinishReason::none) {
    c.engine_done = true;
    ctx_.routes.erase(o.id);
  }
  if (c.done) return;
  if (!o.prompt_logprobs.empty()) {
    add_prompt_logprobs(c, o);
    if (o.token < 0 && o.finish == runtime::FinishReason::none) return;
  }
  cached_tokens_ = std::max(cached_tokens_, o.cached_tokens);
  prompt_tokens_ = o.prompt_tokens > 0 ? o.prompt_tokens : prompt_tokens_;
  c.spec_verify_ct = std::max(c.spec_verify_ct, o.spec_verify_ct);
  c.spec_accepted_drafts = std::max(c.spec_accepted_drafts, o.spec_accepted_drafts);
  std::string text;
  if (o.token >= 0) {
    const auto now = Clock::now();
    if (!first_token_seen_) {
      ctx_.metrics->observe_ttft(seconds(now - arrival_));
      first_token_seen_ = true;
    } else if (c.tokens > 0) {
      ctx_.metrics->observe_itl(seconds(now - c.last_token));
    }
    c.last_token = now;
    ++c.tokens;
    c.token_ids.push_back(o.token);
    if (spec_.params.logprobs) add_logprob(c, o);
    text = c.stop.feed(c.detok->step(uint32_t(o.token)));
    if (c.stop.matched()) {
      c.done = true;
      c.finish_reason = "stop";
      if (!c.engine_done) ctx_.engine->abort(c.engine_id);
    }
  }
  if (!c.done && o.finish != runtime::FinishReason::none) {
    text += c.stop.feed(c.detok->finish());
    text += c.stop.flush();
    c.done = true;
    switch (o.finish) {
      case runtime::FinishReason::stop: c.finish_reason = "stop"; break;
      case runtime::FinishReason::length: c.finish_reason = "length"; break;
      case runtime::FinishReason::error:
        c.finish_reason = "error";
        c.error = o.error;
        break;
      default: c.finish_reason = "abort"; break;
    }
  }
  if (!c.error.empty()) {
    // An engine error (the prompt cannot be served): the whole request fails.
    fail(ApiError(400, c.error, spec_.chat ? "messages" : "prompt"));
    return;
  }
  emit(c, index, text, c.done);
  for (const Choice& x : choices_) {
    if (!x.done) return;
  }
  complete();
}

void Job::complete() {
  if (finished_) return;
  finished_ = true;
  --ctx_.active_jobs;
  const json u = usage();
  ctx_.metrics->add_tokens(prompt_tokens_, u["completion_tokens"].get<int64_t>());
  ctx_.metrics->observe_e2e(seconds(Clock::now() - arrival_));
  if (cancelled_) {
    sink_->job_done();
    return;
  }
  ctx_.metrics->request_done(endpoint_, 200);
  if (spec_.stream) {
    if (spec_.include_usage) {
      json chunk = chunk_base();
      chunk["choices"] = json::array();
      chunk["usage"] = u;
      sink_->stream_event(dump_json(chunk));
    }
    sink_->stream_event("[DONE]");
    sink_->stream_end();
  } else {
    json choices = json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const Choice& c = choices_[i];
      json ch = {{"index", i}};
      if (spec_.chat) {
        json msg = {{"role", "assistant"}, {"content", c.parser ? c.parsed.content : c.text}};
        if (c.parser && !c.parsed.reasoning_content.empty())
          msg["reasoning_content"] = c.parsed.reasoning_content;
        if (c.parser && !c.parsed.tool_calls.empty()) {
          json calls = json::array();
          for (const chat::ParsedToolCall& t : c.parsed.tool_calls) {
            calls.push_back({{"id", t.id},
                             {"type", "function"},
                             {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
          }
          msg["tool_calls"] = calls;
          if (c.parsed.content.empty()) msg["content"] = nullptr;
        }
        ch["message"] = msg;
        ch["logprobs"] = spec_.params.logprobs ? json{{"content", c.logprobs}} : json(nullptr);
      } else {
        ch["text"] = echo() ? echo_text_ + c.text : c.text;
        if (spec_.params.logprobs) {
          json entries = c.prompt_logprobs;  // empty without echo
          for (const json& e : c.logprobs) entries.push_back(e);
          ch["logprobs"] = completion_logprobs(entries);
        } else {
          ch["logprobs"] = nullptr;
        }
      }
      ch["finish_reason"] = c.finish_reason;
      if (spec_.return_token_ids) ch["token_ids"] = c.token_ids;
      choices.push_back(std::move(ch));
    }
    json body = {{"id", id_},           {"object", spec_.chat ? "chat.completion" : "text_completion"},
                 {"created", created_}, {"model", ctx_.model_name},
                 {"choices", choices},  {"usage", u}};
    sink_->send(200, body.dump(), "application/json");
  }
  sink_->job_done();
}

}  // namespace dsaserve::server
