#include "server/constrained.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <string_view>

#include "grammar/structural_tag.h"

namespace dsaserve::server {

namespace {

// chat_template_kwargs that turn thinking off (GLM: enable_thinking, DeepSeek V3.x: thinking).
bool thinking_disabled(const GenerationSpec& spec) {
  const auto k = spec.chat_request.find("chat_template_kwargs");
  if (k == spec.chat_request.end() || !k->is_object()) return false;
  for (const char* key : {"enable_thinking", "thinking"}) {
    const auto v = k->find(key);
    if (v != k->end() && v->is_boolean() && !v->get<bool>()) return true;
  }
  return false;
}

}  // namespace

std::unique_ptr<grammar::GrammarBackend> make_grammar_backend(const tokenizer::Tokenizer& tok,
                                                              int64_t vocab_size,
                                                              const std::vector<int32_t>& eos_token_ids) {
  try {
    const auto t0 = std::chrono::steady_clock::now();
    auto backend = std::make_unique<grammar::GrammarBackend>(tok, vocab_size, eos_token_ids);
    std::fprintf(stderr, "dsaserve serve: grammar backend (xgrammar) over %lld ids ready in %.3f s\n",
                 static_cast<long long>(vocab_size),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return backend;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsaserve serve: no grammar-constrained decoding: %s\n", e.what());
    return nullptr;
  }
}

int64_t reasoning_budget(int64_t max_new_tokens) {
  int64_t b = 1;
  while (b * 2 <= max_new_tokens / 2) b *= 2;
  return b;
}

grammar::ReasoningPrefix reasoning_prefix(const GenerationSpec& spec, bool reasoning,
                                          const std::string& prompt_text) {
  // A template that closes the reasoning block itself (thinking off by default, e.g. DeepSeek V3.1's
  // "...<｜Assistant｜></think>") leaves no reasoning for the model to write.
  std::string_view tail(prompt_text);
  while (!tail.empty() &&
         (tail.back() == ' ' || tail.back() == '\n' || tail.back() == '\r' || tail.back() == '\t'))
    tail.remove_suffix(1);
  const bool closed_in_prompt = tail.ends_with("</think>");
  grammar::ReasoningPrefix prefix;
  prefix.enabled = spec.chat && reasoning && !thinking_disabled(spec) && !closed_in_prompt;
  prefix.opened_in_prompt = prefix.enabled && chat::prompt_opens_reasoning(prompt_text);
  prefix.max_tokens = reasoning_budget(spec.params.max_new_tokens);
  return prefix;
}

std::shared_ptr<const grammar::CompiledGrammar> request_grammar(grammar::GrammarBackend* backend,
                                                                const GenerationSpec& spec,
                                                                chat::ToolCallFormat tool_format,
                                                                bool reasoning,
                                                                const std::string& prompt_text) {
  const bool forced_call =
      spec.chat && spec.has_tools && spec.tool_choice != "auto" && spec.tool_choice != "none";
  const bool json_output = spec.response_format != "text";
  if (!forced_call && !json_output) return nullptr;
  const char* param = forced_call ? "tool_choice" : "response_format";
  if (forced_call && tool_format == chat::ToolCallFormat::kNone) {
    throw ApiError(400, "tool_choice 'required' or a named function needs the server's --tool-call-parser",
                   param);
  }
  if (backend == nullptr) {
    throw ApiError(
        400, fmt::format("{} needs grammar-constrained decoding, which this server cannot do", param), param);
  }
  nlohmann::ordered_json format;
  try {
    format = forced_call ? grammar::tool_calls_format(tool_format, spec.chat_request["tools"],
                                                      spec.tool_choice, spec.parallel_tool_calls)
                         : grammar::json_format(spec.response_format == "json_schema"
                                                    ? spec.response_schema
                                                    : nlohmann::ordered_json(nullptr));
  } catch (const std::exception& e) {
    throw ApiError(400, e.what(), forced_call ? "tools" : "response_format");
  }
  try {
    return backend->compile(grammar::structural_tag(format, reasoning_prefix(spec, reasoning, prompt_text)));
  } catch (const std::exception& e) {
    throw ApiError(400, fmt::format("cannot build the grammar for {}: {}", param, e.what()),
                   forced_call                             ? "tools"
                   : spec.response_format == "json_schema" ? "response_format.json_schema.schema"
                                                           : "response_format");
  }
}

}  // namespace dsaserve::server
