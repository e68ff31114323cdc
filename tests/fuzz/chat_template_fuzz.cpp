// libFuzzer target over chat-template rendering. Input "TEMPLATE\0REQUEST": the template text parsed
// and rendered on a fixed conversation, and REQUEST (JSON: {"messages": [...], "tools": ...} or just the
// messages array) rendered with the real templates the fixtures carry (GLM-4.6, DeepSeek-V3) and the
// built-in one. Without a NUL byte the whole input is the request. Failures may only be
// dsaserve::Error (TemplateError and the like); rendered text from valid JSON is valid UTF-8.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "core/error.h"
#include "fuzz/fuzz_util.h"
#include "server/builtin.h"

namespace {

using dsaserve::chat::ChatTemplate;
using json = nlohmann::ordered_json;

const json& special_tokens() {
  static const json s = {{"bos_token", "<|begin|>"}, {"eos_token", "<|endoftext|>"}};
  return s;
}

const std::vector<std::unique_ptr<ChatTemplate>>& templates() {
  static const auto all = [] {
    std::vector<std::unique_ptr<ChatTemplate>> v;
    v.push_back(std::make_unique<ChatTemplate>(dsaserve::server::builtin_chat_template(), special_tokens()));
    for (const char* name : {"glm_4_6.jinja", "deepseek_v3.jinja"}) {
      std::ifstream f(dsaserve::fuzz::fixtures_dir() / "templates" / name);
      if (!f) {
        std::fprintf(stderr, "chat_template_fuzz: fixture template %s missing\n", name);
        continue;
      }
      std::stringstream ss;
      ss << f.rdbuf();
      v.push_back(std::make_unique<ChatTemplate>(ss.str(), special_tokens()));
    }
    return v;
  }();
  return all;
}

// `utf8_source`: the template text is valid UTF-8 (then so must the output be; the request's strings are,
// as parsed JSON).
void render(const ChatTemplate& t, const json& request, bool utf8_source = true) {
  try {
    const std::string out = t.render(request);
    DSA_FUZZ_CHECK(!utf8_source || dsaserve::fuzz::valid_utf8(out));
  } catch (const dsaserve::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  if (nul != std::string::npos) {
    static const json conversation = json::parse(
        R"({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
             {"role": "assistant", "content": "hello", "tool_calls": [{"type": "function",
              "function": {"name": "f", "arguments": {"x": 1}}}]}, {"role": "tool", "content": "2"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "add_generation_prompt": true})");
    try {
      const std::string source = in.substr(0, nul);
      const ChatTemplate t(source, special_tokens());
      render(t, conversation, dsaserve::fuzz::valid_utf8(source));
    } catch (const dsaserve::Error&) {
    }
  }
  const std::string req = nul == std::string::npos ? in : in.substr(nul + 1);
  json request;
  try {  // nesting bounded as the server bounds request bodies
    request = json::parse(req, [](int depth, json::parse_event_t, json&) {
      if (depth > 64) throw dsaserve::Error("too deep");
      return true;
    });
  } catch (const std::exception&) {
    return 0;
  }
  if (request.is_null()) return 0;
  if (!request.is_object()) request = json{{"messages", std::move(request)}, {"add_generation_prompt", true}};
  for (const auto& t : templates()) render(*t, request);
  return 0;
}
