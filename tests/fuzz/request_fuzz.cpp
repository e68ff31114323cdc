// libFuzzer target over a request body on its way to the engine, as the server prepares it: JSON
// parsing (the server's parse_json_body, within its limits), /v1/chat/completions or /v1/completions
// validation, the chat template, the tokenizer, and the grammar for tool_choice / response_format
// (compiled by xgrammar over the built-in vocabulary). Bad input may only end in ApiError (4xx) or, from
// the template and tokenizer, a dsaserve::Error the server turns into a 400; every error body must be
// writable as JSON. The input's length picks the endpoint, the tool-call format and reasoning.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "chat/chat_template.h"
#include "core/error.h"
#include "fuzz/fuzz_util.h"
#include "server/builtin.h"
#include "server/constrained.h"
#include "server/json_body.h"
#include "server/openai.h"

namespace {

using dsaserve::server::ApiError;
using json = nlohmann::ordered_json;

struct Setup {
  dsaserve::tokenizer::Tokenizer tok = dsaserve::server::make_builtin_tokenizer();
  dsaserve::chat::ChatTemplate chat{
      dsaserve::server::builtin_chat_template(),
      json{{"bos_token", dsaserve::server::kBuiltinBos}, {"eos_token", dsaserve::server::kBuiltinEos}}};
  std::unique_ptr<dsaserve::grammar::GrammarBackend> grammar;
  int64_t vocab = 512;
  Setup() {
    grammar = dsaserve::server::make_grammar_backend(
        tok, vocab, {int32_t(*tok.token_to_id(dsaserve::server::kBuiltinEos))});
  }
};

const Setup& setup() {
  static const Setup s;
  return s;
}

constexpr dsaserve::chat::ToolCallFormat kFormats[] = {
    dsaserve::chat::ToolCallFormat::kNone, dsaserve::chat::ToolCallFormat::kGlm45,
    dsaserve::chat::ToolCallFormat::kDeepSeekV3, dsaserve::chat::ToolCallFormat::kDeepSeekV32};

void prepare(const std::string& raw, bool chat, dsaserve::chat::ToolCallFormat format, bool reasoning) {
  const Setup& s = setup();
  const json body = dsaserve::server::parse_json_body(raw, dsaserve::server::JsonLimits{});  // the server's
  dsaserve::server::GenerationSpec spec = chat ? dsaserve::server::parse_chat_request(body, s.vocab)
                                               : dsaserve::server::parse_completion_request(body, s.vocab);
  std::string text;
  if (chat) {
    text = s.chat.render(spec.chat_request);
  } else if (spec.prompt_text) {
    text = *spec.prompt_text;
  }
  DSA_FUZZ_CHECK(dsaserve::fuzz::valid_utf8(text));
  for (uint32_t id : s.tok.encode(text)) DSA_FUZZ_CHECK(int64_t(id) < s.vocab);
  dsaserve::server::request_grammar(s.grammar.get(), spec, format, reasoning, text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string raw(reinterpret_cast<const char*>(data), size);
  const bool chat = size % 2 == 0;
  const auto format = kFormats[(size / 2) % 4];
  const bool reasoning = (size / 8) % 2 == 1;
  try {
    prepare(raw, chat, format, reasoning);
  } catch (const ApiError& e) {
    DSA_FUZZ_CHECK(e.status >= 400 && e.status < 500);
    (void)e.body().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } catch (const dsaserve::Error& e) {  // template / tokenizer errors: the server answers 400
    (void)json(e.what()).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  return 0;
}
