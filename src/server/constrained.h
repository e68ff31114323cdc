#pragma once
// Which requests decode under a grammar, and which grammar: tool_choice "required" or a named function
// (chat, with tools and a --tool-call-parser) -> the calls in the model's tool-call format;
// response_format json_object / json_schema (both endpoints) -> a JSON value. With a reasoning parser
// and thinking on, a bounded reasoning block comes first (see grammar::ReasoningPrefix). The grammar is
// compiled here, on the HTTP handler's thread, never on the engine's.
#include <memory>
#include <string>
#include <vector>

#include "chat/output_parser.h"
#include "grammar/grammar.h"
#include "grammar/structural_tag.h"
#include "server/openai.h"

namespace dsaserve::server {

// The server's grammar backend over `tok`, or null (with a line on stderr saying why) when it cannot be
// built, e.g. the model has no EOS id: constrained requests are then refused with a 400.
std::unique_ptr<grammar::GrammarBackend> make_grammar_backend(const tokenizer::Tokenizer& tok,
                                                              int64_t vocab_size,
                                                              const std::vector<int32_t>& eos_token_ids);

// The reasoning block of a forced call may use at most this share of max_tokens (a power of two, so
// that nearby max_tokens values share one compiled grammar): the call itself still fits.
int64_t reasoning_budget(int64_t max_new_tokens);

// The reasoning block a constrained chat request starts with: on with a reasoning parser (`reasoning`)
// unless chat_template_kwargs turn thinking off or the rendered prompt already ends the block
// (`</think>`); `opened_in_prompt` when the prompt opened it.
grammar::ReasoningPrefix reasoning_prefix(const GenerationSpec& spec, bool reasoning,
                                          const std::string& prompt_text);

// The compiled grammar `spec` needs, or null when its output is free. `backend` may be null (no grammar
// support: a constrained request is then a 400). `reasoning`: a --reasoning-parser is set. Throws
// ApiError (400 naming tool_choice / tools / response_format) when the grammar cannot be built.
std::shared_ptr<const grammar::CompiledGrammar> request_grammar(grammar::GrammarBackend* backend,
                                                                const GenerationSpec& spec,
                                                                chat::ToolCallFormat tool_format,
                                                                bool reasoning,
                                                                const std::string& prompt_text);

}  // namespace dsaserve::server
