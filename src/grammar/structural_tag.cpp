#include "grammar/structural_tag.h"

#include <algorithm>

#include "core/error.h"

namespace dsaserve::grammar {

using json = nlohmann::ordered_json;  // schemas keep their property order

namespace {

// Whitespace inside JSON values (arguments, response_format): at most one character per separator, the
// least xgrammar's JSON-schema grammar allows (0 is not a valid bound there), so a random or confused model
// spends no tokens on runs of it (with 4, a call's JSON took ~15 whitespace tokens on the demo model).
constexpr int kMaxWhitespace = 1;

// Length-bounded strings of `schema` (recursively) as an equivalent pattern of characters that need no
// escape (nor surrogates, see raw_value): xgrammar drops minLength / maxLength of strings filtered by
// `excludes` (below), not patterns.
void bounded_strings_as_patterns(json& schema) {
  if (!schema.is_object()) return;
  const bool bounded = schema.contains("minLength") || schema.contains("maxLength");
  if (bounded && schema.value("type", json()) == "string" && !schema.contains("pattern") &&
      !schema.contains("format") && !schema.contains("enum") && !schema.contains("const")) {
    const int64_t lo =
        schema.value("minLength", json(0)).is_number_unsigned() ? schema["minLength"].get<int64_t>() : 0;
    const json hi = schema.value("maxLength", json());
    const std::string upper = hi.is_number_unsigned() ? std::to_string(hi.get<int64_t>()) : "";
    schema["pattern"] = "^[^\\x00-\\x1f\"\\\\\\uD800-\\uDFFF]{" + std::to_string(lo) + "," + upper + "}$";
    schema.erase("minLength");
    schema.erase("maxLength");
  }
  for (const char* key : {"properties", "patternProperties", "$defs", "definitions"}) {
    if (schema.contains(key) && schema[key].is_object()) {
      for (auto& [k, v] : schema[key].items()) bounded_strings_as_patterns(v);
    }
  }
  for (const char* key : {"items", "additionalProperties", "prefixItems", "anyOf", "oneOf", "allOf"}) {
    if (!schema.contains(key)) continue;
    json& v = schema[key];
    if (v.is_array()) {
      for (json& x : v) bounded_strings_as_patterns(x);
    } else {
      bounded_strings_as_patterns(v);
    }
  }
}

// A JSON value of `schema`. xgrammar's JSON strings admit raw control characters, which JSON does not
// (json.loads and nlohmann reject them): they are excluded.
json json_value(json schema) {
  json controls = json::array();
  for (char c = 0; c < 0x20; ++c) controls.push_back(std::string(1, c));
  bounded_strings_as_patterns(schema);
  return {{"type", "json_schema"},
          {"json_schema", std::move(schema)},
          {"style", "json"},
          {"max_whitespace_cnt", kMaxWhitespace},
          {"excludes", std::move(controls)}};
}

json const_string(const std::string& s) { return {{"type", "const_string"}, {"value", s}}; }

json sequence(json elements) { return {{"type", "sequence"}, {"elements", std::move(elements)}}; }

json tag(const std::string& begin, json content, const std::string& end) {
  return {{"type", "tag"}, {"begin", begin}, {"content", std::move(content)}, {"end", end}};
}

json parameters_of(const json& function) {
  const auto p = function.find("parameters");
  if (p == function.end() || p->is_null()) return json{{"type", "object"}, {"properties", json::object()}};
  DSA_CHECK(p->is_object(), "tools: function '{}': parameters must be a JSON schema object",
            function["name"].get<std::string>());
  return *p;
}

// The chat module's rule (tool_parser_util): a parameter whose type is "string" (or only string / null)
// is raw text in the XML formats, any other is JSON.
bool raw_string_parameter(const json& schema) {
  const auto t = schema.find("type");
  if (t == schema.end()) return false;
  if (t->is_string()) return *t == "string";
  if (!t->is_array() || t->empty()) return false;
  for (const json& x : *t) {
    if (x.is_string() && x != "string" && x != "null") return false;
  }
  return true;
}

// The value of a raw-text parameter up to `close` (exclusive): its enum / const when given, a regex
// for a pattern or a length bound, else any text without the closing tag.
json raw_value(const json& schema, const std::string& close) {
  if (schema.contains("const") && schema["const"].is_string()) return const_string(schema["const"]);
  if (schema.contains("enum") && schema["enum"].is_array()) {
    json alts = json::array();
    for (const json& v : schema["enum"]) {
      if (v.is_string()) alts.push_back(const_string(v));
    }
    DSA_CHECK(!alts.empty(), "tools: a string parameter's enum has no string value");
    return {{"type", "or"}, {"elements", std::move(alts)}};
  }
  if (schema.contains("pattern") && schema["pattern"].is_string()) {
    return {{"type", "regex"}, {"pattern", schema["pattern"]}};
  }
  if (schema.contains("minLength") || schema.contains("maxLength")) {
    // Counted in characters: a regex (any_text's max_chars counts stray bytes too), without '<' and
    // without UTF-16 surrogates (xgrammar admits their 3-byte forms, which decode to 3 U+FFFD).
    const json lo = schema.value("minLength", json(0)), hi = schema.value("maxLength", json());
    return {
        {"type", "regex"},
        {"pattern", "[^<\\uD800-\\uDFFF]{" + std::to_string(lo.is_number_unsigned() ? lo.get<int64_t>() : 0) +
                        "," + (hi.is_number_unsigned() ? std::to_string(hi.get<int64_t>()) : "") + "}"}};
  }
  return {{"type", "any_text"}, {"excludes", {close}}};
}

// One argument's schema, standalone: the parameters' $defs / definitions come along for $refs.
json property_schema(const json& parameters, const json& schema) {
  json s = schema.is_object() ? schema : json::object();
  for (const char* defs : {"$defs", "definitions"}) {
    if (parameters.contains(defs) && !s.contains(defs)) s[defs] = parameters[defs];
  }
  return s;
}

// XML-like arguments (GLM, DSML): each property of `parameters` in schema order, the required ones
// always and the others optionally, as open(key, raw) VALUE close "\n".
template <class Open>
json xml_arguments(const json& parameters, Open open, const std::string& close) {
  json elements = json::array();
  const json props = parameters.value("properties", json::object());
  DSA_CHECK(props.is_object(), "tools: parameters.properties must be an object");
  const json required = parameters.value("required", json::array());
  for (auto it = props.begin(); it != props.end(); ++it) {
    const bool raw = raw_string_parameter(it.value());
    json value = raw ? raw_value(it.value(), close) : json_value(property_schema(parameters, it.value()));
    json arg = sequence({tag(open(it.key(), raw), std::move(value), close), const_string("\n")});
    const bool must =
        required.is_array() && std::find(required.begin(), required.end(), it.key()) != required.end();
    elements.push_back(must ? std::move(arg) : json{{"type", "optional"}, {"content", std::move(arg)}});
  }
  if (elements.empty()) return const_string("");
  return sequence(std::move(elements));
}

// One call of `function` in the format's text (the chat module's parsers read it back).
json call_tag(chat::ToolCallFormat format, const json& function) {
  const std::string name = function["name"].get<std::string>();
  const json params = parameters_of(function);
  switch (format) {
    case chat::ToolCallFormat::kGlm45:
      // <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>
      return tag(
          "<tool_call>" + name + "\n",
          xml_arguments(
              params, [](const std::string& k, bool) { return "<arg_key>" + k + "</arg_key>\n<arg_value>"; },
              "</arg_value>"),
          "</tool_call>");
    case chat::ToolCallFormat::kDeepSeekV3:
      // <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
      return tag("<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n", json_value(params),
                 "\n```<｜tool▁call▁end｜>");
    case chat::ToolCallFormat::kDeepSeekV32:
      // <｜DSML｜invoke name="NAME">\n<｜DSML｜parameter name="K"
      // string="true|false">V</｜DSML｜parameter>\n...
      // </｜DSML｜invoke>\n
      return tag("<｜DSML｜invoke name=\"" + name + "\">\n",
                 xml_arguments(
                     params,
                     [](const std::string& k, bool raw) {
                       return "<｜DSML｜parameter name=\"" + k + "\" string=\"" + (raw ? "true" : "false") +
                              "\">";
                     },
                     "</｜DSML｜parameter>"),
                 "</｜DSML｜invoke>\n");
    case chat::ToolCallFormat::kNone: break;
  }
  fail("tool_choice: no --tool-call-parser is set, so a tool call cannot be forced");
}

// The wrapper around the calls (DeepSeek formats have one).
json wrap_calls(chat::ToolCallFormat format, json calls) {
  switch (format) {
    case chat::ToolCallFormat::kDeepSeekV3:
      return sequence(
          {const_string("<｜tool▁calls▁begin｜>"), std::move(calls), const_string("<｜tool▁calls▁end｜>")});
    case chat::ToolCallFormat::kDeepSeekV32:
      return sequence({const_string("<｜DSML｜function_calls>\n"), std::move(calls),
                       const_string("</｜DSML｜function_calls>")});
    default: return calls;
  }
}

}  // namespace

json tool_calls_format(chat::ToolCallFormat format, const json& tools, const std::string& tool_choice,
                       bool parallel) {
  DSA_CHECK(tools.is_array() && !tools.empty(), "tool_choice: needs tools");
  json calls = json::array();
  for (const json& tool : tools) {
    DSA_CHECK(tool.is_object() && tool.contains("function") && tool["function"].is_object() &&
                  tool["function"].contains("name") && tool["function"]["name"].is_string(),
              "tools: expected {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}");
    const json& f = tool["function"];
    if (tool_choice == "required" || f["name"] == tool_choice) calls.push_back(call_tag(format, f));
    if (f["name"] == tool_choice) break;
  }
  DSA_CHECK(!calls.empty(), "tool_choice: function '{}' is not in tools", tool_choice);
  if (tool_choice != "required") return wrap_calls(format, calls[0]);
  // One or more calls (one when !parallel), nothing between them.
  return wrap_calls(format, {{"type", "tags_with_separator"},
                             {"tags", std::move(calls)},
                             {"separator", ""},
                             {"at_least_one", true},
                             {"stop_after_first", !parallel}});
}

json json_format(const json& schema) {
  json s = schema.is_null() ? json{{"type", "object"}, {"additionalProperties", true}} : schema;
  return json_value(s);
}

json structural_tag(const json& format, const ReasoningPrefix& reasoning) {
  json f = format;
  if (reasoning.enabled) {
    json text = {{"type", "any_text"}, {"excludes", {"<think>", "</think>"}}};
    if (reasoning.max_tokens > 0) text["max_tokens"] = reasoning.max_tokens;
    f = sequence(
        {tag(reasoning.opened_in_prompt ? "" : "<think>", std::move(text), "</think>"), std::move(f)});
  }
  return {{"type", "structural_tag"}, {"format", std::move(f)}};
}

}  // namespace dsaserve::grammar
