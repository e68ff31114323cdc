#pragma once
// What a constrained request's output must look like, as an xgrammar structural tag (JSON: formats such
// as "tag", "sequence", "json_schema" with a model's argument style, "any_text"). Built here from the
// request (tools + tool_choice in the model's tool-call format, or a response_format schema) and
// compiled by GrammarBackend. Pure JSON building: no xgrammar dependency, errors are dsaserve::Error.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/output_parser.h"

namespace dsaserve::grammar {

// The reasoning block before the constrained part (thinking models, SGLang's reasoning-aware grammar):
// `<think>` (omitted when the prompt already opened it) then free text without `<think>`/`</think>`
// of at most max_tokens tokens, then `</think>`; the grammar forces the close when the budget is spent.
struct ReasoningPrefix {
  bool enabled = false;
  bool opened_in_prompt = false;
  int64_t max_tokens = 0;
};

// The calls a forced tool_choice allows, in `format`'s text (what the chat module's parser reads):
// tool_choice "required": one or more calls of any of `tools` (exactly one when !parallel); any other
// value names the one function to call once. Argument values follow each function's JSON-schema `parameters`
// (GLM / DSML: string parameters as raw text, others as JSON). Throws dsaserve::Error when the format has no
// tool calls or the tool is unknown.
nlohmann::ordered_json tool_calls_format(chat::ToolCallFormat format, const nlohmann::ordered_json& tools,
                                         const std::string& tool_choice, bool parallel = true);

// A JSON value following `schema` (response_format json_schema), or any JSON object when `schema` is
// null (response_format json_object).
nlohmann::ordered_json json_format(const nlohmann::ordered_json& schema);

// The whole structural tag: the reasoning prefix (when enabled) followed by `format`.
nlohmann::ordered_json structural_tag(const nlohmann::ordered_json& format, const ReasoningPrefix& reasoning);

}  // namespace dsaserve::grammar
