#pragma once
// The OpenAI API layer: request validation (each error names the field, OpenAI's error object) and the
// plain description of a generation request the server runs. No I/O here.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "runtime/sampler/sampling_params.h"

namespace dsaserve::grammar {
class CompiledGrammar;
}

namespace dsaserve::server {

// An error answered to the client: HTTP status and OpenAI's {"error": {message, type, param, code}}.
struct ApiError : std::runtime_error {
  int status;
  std::string type;
  std::string param;
  std::string code;
  ApiError(int status_, std::string message, std::string param_ = "",
           std::string type_ = "invalid_request_error", std::string code_ = "")
      : std::runtime_error(std::move(message)),
        status(status_),
        type(std::move(type_)),
        param(std::move(param_)),
        code(std::move(code_)) {}
  nlohmann::json body() const;
};

// What /v1/chat/completions and /v1/completions have in common, validated.
struct GenerationSpec {
  bool chat = false;
  std::string model;  // as sent (empty: not sent)
  runtime::SamplingParams params;
  bool max_tokens_given = false;
  int64_t n = 1;
  bool stream = false;
  bool include_usage = false;
  std::vector<std::string> stop;
  bool skip_special_tokens = true;
  bool echo = false;              // completions only
  bool return_token_ids = false;  // extension (like vLLM's): choices[i].token_ids in non-streamed responses
  // Chat: the request for the chat template ({messages, tools?, add_generation_prompt,
  // chat_template_kwargs?}). Completions: the prompt as text or as token ids.
  nlohmann::ordered_json chat_request;
  // continue_final_message: the prompt ends right after this text of the final message (transformers' cut).
  std::optional<std::string> continue_final_text;
  nlohmann::json parser_tools;  // the tools again, for the tool-call output parser
  bool has_tools = false;
  std::string tool_choice = "auto";  // "auto", "none", "required", or a function name (forced)
  bool parallel_tool_calls = true;   // false: tool_choice "required" allows one call only
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;
  // response_format: "text" (unconstrained), "json_object" or "json_schema" (with response_schema).
  std::string response_format = "text";
  nlohmann::ordered_json response_schema;  // the request's own key order (properties come out in it)
  // Set by the server when the output is grammar-constrained (tool_choice required / named,
  // response_format): each choice decodes under its own matcher of this grammar.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
};

// Parses and validates a request body; throws ApiError (400) naming the field. `vocab_size` bounds token
// ids (prompt ids, logit_bias, stop_token_ids); `max_n` bounds n.
GenerationSpec parse_chat_request(const nlohmann::ordered_json& body, int64_t vocab_size, int64_t max_n = 16);
GenerationSpec parse_completion_request(const nlohmann::ordered_json& body, int64_t vocab_size,
                                        int64_t max_n = 16);

// Fits a parsed chat request's assistant turns of tool calls to the chat template's form: their null
// content becomes "" unless the template renders calls only under a null one; arguments sent as JSON text
// become objects where the template walks them (each must then be the text of a JSON object: 400 naming
// the field otherwise). As vLLM and SGLang turn the arguments into objects before rendering.
void fit_tool_call_form(GenerationSpec& spec, const chat::ToolCallForm& form);

}  // namespace dsaserve::server
