#include "server/openai.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "server/json_body.h"

namespace dsaserve::server {

nlohmann::json ApiError::body() const {
  using nlohmann::json;
  json e = {{"message", what()},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}};
  return json{{"error", e}};
}

// Request bodies keep their key order: messages, tools and schemas reach the chat template and the
// grammar in the order the client wrote them (as Python's dicts do for SGLang / transformers).
using json = nlohmann::ordered_json;

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg) {
  throw ApiError(400, fmt::format("{}: {}", param, msg), param);
}

const char* type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// Optional field accessors: absent or null -> nullopt; wrong type or range -> 400 naming the field.
std::optional<double> get_number(const json& b, const char* key, double lo, double hi) {
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) bad(key, fmt::format("expected a number, got {}", type_name(*it)));
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) bad(key, fmt::format("{} is not in [{}, {}]", v, lo, hi));
  return v;
}

std::optional<int64_t> get_int(const json& b, const char* key, int64_t lo, int64_t hi) {
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  const auto out_of_range = [&](const std::string& v) {
    bad(key, fmt::format("{} is not in [{}, {}]", v, lo, hi));
  };
  int64_t v = 0;
  if (it->is_number_unsigned()) {  // JSON's non-negative integers, up to 2^64 - 1
    const uint64_t u = it->get<uint64_t>();
    if (hi < 0 || u > uint64_t(hi)) out_of_range(std::to_string(u));
    v = int64_t(u);
  } else if (it->is_number_integer()) {
    v = it->get<int64_t>();
  } else if (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>()) {
    const double d = it->get<double>();  // an integer written as 2.0 or 1e3
    // Doubles in (-2^63, 2^63) convert to int64 exactly; others are out of any int64 range.
    // -2^63 itself only as an integer literal (which arrives as one): a float equal to it is also what every
    // integer literal down to -2^63 - 1024 rounds to (-9223372036854775809 would pass as the minimum).
    if (!(d > -9223372036854775808.0 && d < 9223372036854775808.0)) out_of_range(fmt::format("{}", d));
    v = int64_t(d);
  } else {
    bad(key, fmt::format("expected an integer, got {}", type_name(*it)));
  }
  if (v < lo || v > hi) out_of_range(std::to_string(v));
  return v;
}

std::optional<bool> get_bool(const json& b, const char* key) {
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) bad(key, fmt::format("expected a boolean, got {}", type_name(*it)));
  return it->get<bool>();
}

void parse_common(const json& b, int64_t vocab, int64_t max_n, GenerationSpec& s) {
  if (!b.is_object()) throw ApiError(400, "the request body must be a JSON object");
  if (auto it = b.find("model"); it != b.end() && !it->is_null()) {
    if (!it->is_string()) bad("model", fmt::format("expected a string, got {}", type_name(*it)));
    s.model = it->get<std::string>();
  }
  runtime::SamplingParams& p = s.params;
  if (auto v = get_number(b, "temperature", 0, 2)) p.temperature = float(*v);
  if (auto v = get_number(b, "top_p", 0, 1)) {
    // float(1e-300) is 0: the value the sampler would get must be > 0.
    if (float(*v) <= 0) bad("top_p", fmt::format("must be greater than 0 (as a float32), got {}", *v));
    p.top_p = float(*v);
  }
  if (auto v = get_int(b, "top_k", -1, std::numeric_limits<int32_t>::max())) p.top_k = int32_t(*v);
  if (auto v = get_number(b, "min_p", 0, 1)) p.min_p = float(*v);
  if (auto v = get_number(b, "presence_penalty", -2, 2)) p.presence_penalty = float(*v);
  if (auto v = get_number(b, "frequency_penalty", -2, 2)) p.frequency_penalty = float(*v);
  if (auto v = get_number(b, "repetition_penalty", 0, 2)) {
    if (float(*v) <= 0)
      bad("repetition_penalty", fmt::format("must be greater than 0 (as a float32), got {}", *v));
    p.repetition_penalty = float(*v);
  }
  if (auto v = get_int(b, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    p.seed = uint64_t(*v);
  }
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (auto v = get_int(b, key, 1, std::numeric_limits<int32_t>::max())) {
      p.max_new_tokens = *v;
      s.max_tokens_given = true;
    }
  }
  if (auto v = get_int(b, "n", 1, max_n)) s.n = *v;
  // Extension (SGLang's): scheduling priority, used with --enable-priority-scheduling.
  if (auto v =
          get_int(b, "priority", std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max())) {
    p.priority = *v;
  }
  if (auto v = get_bool(b, "stream")) s.stream = *v;
  if (auto it = b.find("stream_options"); it != b.end() && !it->is_null()) {
    if (!it->is_object()) bad("stream_options", fmt::format("expected an object, got {}", type_name(*it)));
    if (!s.stream) bad("stream_options", "only allowed when stream is true");
    if (auto v = get_bool(*it, "include_usage")) s.include_usage = *v;
  }
  if (auto it = b.find("response_format"); it != b.end() && !it->is_null()) {
    if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string())
      bad("response_format", "expected {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}");
    const std::string t = (*it)["type"].get<std::string>();
    if (t == "json_schema") {
      auto js = it->find("json_schema");
      if (js == it->end() || !js->is_object())
        bad("response_format.json_schema", "required: {\"name\": ..., \"schema\": {...}}");
      auto schema = js->find("schema");
      if (schema == js->end() || !(schema->is_object() || schema->is_boolean()))
        bad("response_format.json_schema.schema", "expected a JSON schema object");
      s.response_schema = *schema;
    } else if (t != "text" && t != "json_object") {
      bad("response_format.type", fmt::format("expected text, json_object or json_schema, got '{}'", t));
    }
    s.response_format = t;
  }
  if (auto v = get_bool(b, "ignore_eos")) p.ignore_eos = *v;
  if (auto v = get_bool(b, "skip_special_tokens")) s.skip_special_tokens = *v;
  if (auto v = get_bool(b, "return_token_ids")) s.return_token_ids = *v;
  if (auto it = b.find("stop"); it != b.end() && !it->is_null()) {
    if (it->is_string()) {
      s.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > 16) bad("stop", "at most 16 stop strings");
      for (const json& x : *it) {
        if (!x.is_string()) bad("stop", fmt::format("expected strings, got {}", type_name(x)));
        s.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", fmt::format("expected a string or an array of strings, got {}", type_name(*it)));
    }
    for (const std::string& x : s.stop) {
      if (x.empty()) bad("stop", "stop strings must not be empty");
    }
  }
  if (auto it = b.find("stop_token_ids"); it != b.end() && !it->is_null()) {
    if (!it->is_array()) bad("stop_token_ids", fmt::format("expected an array, got {}", type_name(*it)));
    for (const json& x : *it) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab) {
        bad("stop_token_ids", fmt::format("expected token ids in [0, {})", vocab));
      }
      p.stop_token_ids.push_back(x.get<int32_t>());
    }
  }
  if (auto it = b.find("logit_bias"); it != b.end() && !it->is_null()) {
    if (!it->is_object()) bad("logit_bias", fmt::format("expected an object, got {}", type_name(*it)));
    for (auto kv = it->begin(); kv != it->end(); ++kv) {
      // Decimal digits only (std::stoll alone took " 1" and "+1").
      int64_t id = -1;
      const std::string& k = kv.key();
      if (!k.empty() && k.size() <= 18 &&
          std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; }))
        id = std::stoll(k);
      if (id < 0 || id >= vocab)
        bad("logit_bias", fmt::format("key '{}' is not a token id in [0, {})", kv.key(), vocab));
      if (!kv.value().is_number()) bad("logit_bias", fmt::format("bias of '{}' is not a number", kv.key()));
      const double v = kv.value().get<double>();
      if (!(v >= -100 && v <= 100))
        bad("logit_bias", fmt::format("bias {} of '{}' is not in [-100, 100]", v, kv.key()));
      p.logit_bias.emplace_back(int32_t(id), float(v));
    }
  }
}

std::string flatten_content(const json& content, size_t i) {
  const std::string param = fmt::format("messages[{}].content", i);
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    bad(param, fmt::format("expected a string or an array of parts, got {}", type_name(content)));
  std::string text;
  for (const json& part : content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      bad(param, "only {\"type\": \"text\", \"text\": ...} parts are supported");
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

// A function's name as the tool-call formats carry it (GLM's `<tool_call>name`, DeepSeek's
// `<tool_sep>name\n`): a name with white space or markup could not be parsed back out of the output.
void check_function_name(const json& fn, const std::string& param) {
  auto name = fn.find("name");
  if (name == fn.end() || !name->is_string()) bad(param + ".name", "required string");
  const std::string& v = name->get_ref<const std::string&>();
  if (v.empty()) bad(param + ".name", "must not be empty");
  if (v.size() > 256) bad(param + ".name", "longer than 256 bytes");
  for (unsigned char c : v) {
    if (c <= ' ' || c == 0x7f || c == '<' || c == '>')
      bad(param + ".name", fmt::format("'{}' has white space, a control character or '<' / '>'", v));
  }
}

// An assistant message's tool_calls, as OpenAI takes them: [{id, type: "function", function: {name,
// arguments}}]; arguments are the JSON text of an object (an object itself is taken too, as transformers'
// templates take it).
void check_tool_calls(const json& calls, size_t i) {
  const std::string param = fmt::format("messages[{}].tool_calls", i);
  if (!calls.is_array()) bad(param, fmt::format("expected an array, got {}", type_name(calls)));
  for (size_t j = 0; j < calls.size(); ++j) {
    const json& c = calls[j];
    const std::string at = fmt::format("{}[{}]", param, j);
    if (!c.is_object()) bad(at, fmt::format("expected an object, got {}", type_name(c)));
    auto id = c.find("id");
    if (id == c.end() || !id->is_string()) bad(at + ".id", "required string");
    if (auto type = c.find("type"); type != c.end() && *type != "function")
      bad(at + ".type", "expected \"function\"");
    auto fn = c.find("function");
    if (fn == c.end() || !fn->is_object()) bad(at + ".function", "required object {name, arguments}");
    check_function_name(*fn, at + ".function");
    auto args = fn->find("arguments");
    if (args == fn->end() || !(args->is_string() || args->is_object()))
      bad(at + ".function.arguments", "required string (the arguments' JSON)");
  }
}

// One message of a chat request, checked as OpenAI checks it (content where the role needs it, a tool
// result's tool_call_id, the assistant's tool calls), with its content flattened to text.
json checked_message(const json& m, size_t i) {
  const std::string at = fmt::format("messages[{}]", i);
  if (!m.is_object()) bad(at, "expected an object");
  auto role = m.find("role");
  if (role == m.end() || !role->is_string()) bad(at + ".role", "required string");
  const std::string r = role->get<std::string>();
  if (r != "system" && r != "user" && r != "assistant" && r != "tool" && r != "developer") {
    bad(at + ".role", fmt::format("unknown role '{}'", r));
  }
  auto content = m.find("content");
  const bool has_content = content != m.end() && !content->is_null();
  auto calls = m.find("tool_calls");
  const bool has_calls = calls != m.end() && !calls->is_null();
  if (has_calls) {
    if (r != "assistant" && !(calls->is_array() && calls->empty()))
      bad(at + ".tool_calls", "only assistant messages have tool_calls");
    check_tool_calls(*calls, i);
  }
  // An assistant's turn may be tool calls alone; every other message needs its content.
  if (!has_content && !(r == "assistant" && has_calls && !calls->empty()))
    bad(at + ".content", r == "assistant" ? "required (or tool_calls)" : "required");
  if (has_content && content->is_array() && content->empty())
    bad(at + ".content", "must not be an empty array");
  if (r == "tool") {
    auto id = m.find("tool_call_id");
    if (id == m.end() || !id->is_string()) bad(at + ".tool_call_id", "required string");
  }
  for (const char* key : {"name", "reasoning_content"}) {
    if (auto v = m.find(key); v != m.end() && !v->is_null() && !v->is_string())
      bad(fmt::format("{}.{}", at, key), fmt::format("expected a string, got {}", type_name(*v)));
  }
  json out = m;
  out["role"] = r == "developer" ? "system" : r;
  // A turn of tool calls alone keeps its null content until fit_tool_call_form knows the template's form.
  out["content"] = has_content ? json(flatten_content(*content, i)) : json(nullptr);
  return out;
}

// One entry of `tools`: {"type": "function", "function": {"name", "description"?, "parameters"?}}.
// Returns the function's name.
std::string checked_tool(const json& tool, size_t i) {
  const std::string at = fmt::format("tools[{}]", i);
  if (!tool.is_object()) bad(at, "expected {\"type\": \"function\", \"function\": {\"name\": ...}}");
  if (auto type = tool.find("type"); type != tool.end() && *type != "function")
    bad(at + ".type", "expected \"function\"");
  auto fn = tool.find("function");
  if (fn == tool.end() || !fn->is_object()) bad(at + ".function", "required object {name, parameters?}");
  check_function_name(*fn, at + ".function");
  if (auto d = fn->find("description"); d != fn->end() && !d->is_null() && !d->is_string())
    bad(at + ".function.description", fmt::format("expected a string, got {}", type_name(*d)));
  if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null() && !p->is_object())
    bad(at + ".function.parameters",
        fmt::format("expected an object (a JSON schema), got {}", type_name(*p)));
  return fn->at("name").get<std::string>();
}
}  // namespace

GenerationSpec parse_chat_request(const json& b, int64_t vocab, int64_t max_n) {
  GenerationSpec s;
  s.chat = true;
  parse_common(b, vocab, max_n, s);
  if (auto v = get_bool(b, "logprobs")) s.params.logprobs = *v;
  if (auto v = get_int(b, "top_logprobs", 0, 20)) {
    s.params.top_logprobs = int32_t(*v);
    if (*v > 0 && !s.params.logprobs) bad("top_logprobs", "needs logprobs: true");
  }
  auto it = b.find("messages");
  if (it == b.end()) bad("messages", "required");
  if (!it->is_array() || it->empty()) bad("messages", "expected a non-empty array of messages");
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  for (size_t i = 0; i < it->size(); ++i) msgs.push_back(checked_message((*it)[i], i));
  s.chat_request["messages"] = std::move(msgs);
  // vLLM's and SGLang's extensions: continue the final message (a prefilled answer) instead of opening a new
  // assistant turn; as transformers, the two cannot both be on.
  const std::optional<bool> add_prompt = get_bool(b, "add_generation_prompt");
  if (get_bool(b, "continue_final_message").value_or(false)) {
    if (add_prompt.value_or(false)) {
      bad("continue_final_message", "cannot be true with add_generation_prompt true");
    }
    // transformers continues after the text of the final message's last part
    const json& last = it->back();
    auto content = last.find("content");
    if (content == last.end() || content->is_null())
      bad("continue_final_message", "the final message has no content to continue");
    s.continue_final_text =
        content->is_array() ? content->back().at("text").get<std::string>() : content->get<std::string>();
  }
  s.chat_request["add_generation_prompt"] = add_prompt.value_or(!s.continue_final_text.has_value());
  if (auto t = b.find("tools"); t != b.end() && !t->is_null()) {
    if (!t->is_array()) bad("tools", fmt::format("expected an array, got {}", type_name(*t)));
    std::set<std::string> names;
    for (size_t i = 0; i < t->size(); ++i) {
      const std::string name = checked_tool((*t)[i], i);
      if (!names.insert(name).second)
        bad(fmt::format("tools[{}].function.name", i), fmt::format("'{}' is defined twice", name));
    }
    if (!t->empty()) {
      s.chat_request["tools"] = *t;
      s.has_tools = true;
      // Converted here, on the preparation pool, not on the I/O thread that starts the job.
      s.parser_tools = nlohmann::json::parse(t->dump());
    }
  }
  if (auto tc = b.find("tool_choice"); tc != b.end() && !tc->is_null()) {
    if (tc->is_string()) {
      const std::string v = tc->get<std::string>();
      if (v != "auto" && v != "none" && v != "required")
        bad("tool_choice", "expected auto, none, required or an object");
      s.tool_choice = v;
    } else if (tc->is_object() && tc->contains("function") && (*tc)["function"].is_object() &&
               (*tc)["function"].contains("name") && (*tc)["function"]["name"].is_string()) {
      s.tool_choice = (*tc)["function"]["name"].get<std::string>();
      bool known = false;
      if (auto t = b.find("tools"); t != b.end() && t->is_array()) {
        for (const json& tool : *t) known = known || tool["function"]["name"] == s.tool_choice;
      }
      if (!known) bad("tool_choice", fmt::format("function '{}' is not in tools", s.tool_choice));
    } else {
      bad("tool_choice", "expected a string or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    if (s.tool_choice != "none" && s.tool_choice != "auto" && !s.has_tools) bad("tool_choice", "needs tools");
  }
  if (auto v = get_bool(b, "parallel_tool_calls")) s.parallel_tool_calls = *v;
  if (auto k = b.find("chat_template_kwargs"); k != b.end() && !k->is_null()) {
    if (!k->is_object())
      bad("chat_template_kwargs", fmt::format("expected an object, got {}", type_name(*k)));
    // The request's own template variables are not the client's to replace (transformers: a TypeError,
    // "multiple values for keyword argument"); a kwarg named so would also skip the checks above.
    for (const char* own : {"messages", "tools", "documents", "add_generation_prompt"}) {
      if (k->contains(own))
        bad("chat_template_kwargs", fmt::format("'{}' is the request's own template variable", own));
    }
    s.chat_request["chat_template_kwargs"] = *k;
  }
  return s;
}

void fit_tool_call_form(GenerationSpec& spec, const chat::ToolCallForm& form) {
  auto msgs = spec.chat_request.find("messages");
  if (msgs == spec.chat_request.end()) return;
  for (size_t i = 0; i < msgs->size(); ++i) {
    json& m = (*msgs)[i];
    if (m["content"].is_null() && !(form.renders_calls && form.null_content)) m["content"] = "";
    auto calls = m.find("tool_calls");
    if (!form.object_arguments || calls == m.end() || !calls->is_array()) continue;
    for (size_t j = 0; j < calls->size(); ++j) {
      json& args = (*calls)[j]["function"]["arguments"];
      if (!args.is_string()) continue;
      const std::string param = fmt::format("messages[{}].tool_calls[{}].function.arguments", i, j);
      json parsed;
      try {  // the body's own bounds (nesting, values): the text is the client's
        parsed = parse_json_body(args.get<std::string>(), JsonLimits{});
      } catch (const ApiError& e) {
        bad(param, fmt::format("expected the JSON text of an object: {}", e.what()));
      }
      if (!parsed.is_object()) {
        bad(param,
            "expected the JSON text of an object (this model's chat template takes the arguments as one)");
      }
      args = std::move(parsed);
    }
  }
}

GenerationSpec parse_completion_request(const json& b, int64_t vocab, int64_t max_n) {
  GenerationSpec s;
  parse_common(b, vocab, max_n, s);
  if (auto v = get_int(b, "logprobs", 0, 20)) {
    s.params.logprobs = true;
    s.params.top_logprobs = int32_t(*v);
  }
  if (auto v = get_bool(b, "echo")) s.echo = *v;
  auto it = b.find("prompt");
  if (it == b.end() || it->is_null()) bad("prompt", "required");
  const json* p = &*it;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    s.prompt_text = p->get<std::string>();
  } else if (p->is_array()) {
    if (p->empty()) bad("prompt", "must not be empty");
    for (const json& x : *p) {
      if (!x.is_number_integer()) {
        bad("prompt",
            "expected a string, an array of token ids, or one of those in an array (batches of "
            "prompts are not supported: send one request each)");
      }
      // x as sent: an id past int64 (a JSON unsigned) would read back as a negative one.
      const int64_t id =
          x.is_number_unsigned() && x.get<uint64_t>() > uint64_t(vocab) ? vocab : x.get<int64_t>();
      if (id < 0 || id >= vocab)
        bad("prompt", fmt::format("token id {} is outside the vocabulary [0, {})", x.dump(), vocab));
      s.prompt_ids.push_back(int32_t(id));
    }
  } else {
    bad("prompt", fmt::format("expected a string or an array of token ids, got {}", type_name(*p)));
  }
  return s;
}

}  // namespace dsaserve::server
