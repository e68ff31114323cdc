#include "chat/tool_parser_util.h"

#include <random>

namespace dsaserve::chat {

std::string random_tool_call_id(int) {
  static const char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return id;
}

void OutputDelta::append(const OutputDelta& other) {
  content += other.content;
  reasoning_content += other.reasoning_content;
  tool_calls.insert(tool_calls.end(), other.tool_calls.begin(), other.tool_calls.end());
}

void ParsedMessage::apply(const OutputDelta& d) {
  content += d.content;
  reasoning_content += d.reasoning_content;
  for (const ToolCallDelta& t : d.tool_calls) {
    if (static_cast<size_t>(t.index) >= tool_calls.size())
      tool_calls.resize(static_cast<size_t>(t.index) + 1);
    ParsedToolCall& c = tool_calls[static_cast<size_t>(t.index)];
    if (!t.id.empty()) c.id = t.id;
    if (!t.name.empty()) c.name = t.name;
    c.arguments += t.arguments;
  }
}

namespace detail {

size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  const size_t max = std::min(text.size(), tag.size() - 1);
  for (size_t k = max; k > 0; --k) {
    if (text.substr(text.size() - k) == tag.substr(0, k)) return k;
  }
  return 0;
}

namespace {
bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
}  // namespace

Match match_after_whitespace(std::string_view text, std::string_view tag, size_t* ws) {
  size_t i = 0;
  while (i < text.size() && is_ws(text[i])) ++i;
  *ws = i;
  const std::string_view rest = text.substr(i);
  if (rest.size() >= tag.size()) return rest.substr(0, tag.size()) == tag ? Match::kYes : Match::kNo;
  return tag.substr(0, rest.size()) == rest ? Match::kPartial : Match::kNo;
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_ws(s[b])) ++b;
  while (e > b && is_ws(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

std::string json_string(std::string_view s) {
  return nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

// The schema "type" of tool `tool`'s parameter `key`, or null.
nlohmann::json schema_type(const nlohmann::json& tools, const std::string& tool, const std::string& key) {
  if (!tools.is_array()) return nullptr;
  for (const auto& t : tools) {
    const nlohmann::json& f = t.contains("function") ? t["function"] : t;
    if (!f.is_object() || f.value("name", "") != tool) continue;
    const auto params = f.find("parameters");
    if (params == f.end() || !params->is_object()) return nullptr;
    const auto props = params->find("properties");
    if (props == params->end() || !props->is_object() || !props->contains(key)) return nullptr;
    const auto& p = (*props)[key];
    return p.is_object() && p.contains("type") ? p["type"] : nlohmann::json(nullptr);
  }
  return nullptr;
}

bool is_string_type(const nlohmann::json& type) {
  if (type.is_string()) return type.get<std::string>() == "string";
  if (type.is_array()) {
    for (const auto& t : type) {
      if (t.is_string() && t.get<std::string>() != "string" && t.get<std::string>() != "null") return false;
    }
    return !type.empty();
  }
  return false;
}

}  // namespace

bool is_string_argument(const nlohmann::json& tools, const std::string& tool, const std::string& key) {
  return is_string_type(schema_type(tools, tool, key));
}

std::string typed_argument(const nlohmann::json& tools, const std::string& tool, const std::string& key,
                           const std::string& raw) {
  const nlohmann::json type = schema_type(tools, tool, key);
  if (is_string_type(type)) return json_string(raw);
  const std::string t = trim(raw);
  if (t == "True") return "true";
  if (t == "False") return "false";
  if (t == "None") return "null";
  if (!t.empty() && nlohmann::json::accept(t)) return t;
  return json_string(raw);
}

void StreamBase::open_call(const std::string& name, OutputDelta* out) {
  current_name_ = name;
  ToolCallDelta d;
  d.index = next_index_;
  d.id = make_id_(next_index_);
  d.name = name;
  out->tool_calls.push_back(std::move(d));
  raw_.clear();
}

void StreamBase::add_arguments(const std::string& fragment, OutputDelta* out) {
  if (!out->tool_calls.empty() && out->tool_calls.back().index == next_index_) {
    out->tool_calls.back().arguments += fragment;
  } else {
    ToolCallDelta d;
    d.index = next_index_;
    d.arguments = fragment;
    out->tool_calls.push_back(std::move(d));
  }
  raw_.clear();
}

namespace {
// Bytes at the end of `s` that start an incomplete UTF-8 sequence.
size_t incomplete_utf8_tail(std::string_view s) {
  for (size_t k = 1; k <= 3 && k <= s.size(); ++k) {
    const auto c = static_cast<unsigned char>(s[s.size() - k]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > k ? k : 0;
  }
  return 0;
}
}  // namespace

bool StreamBase::stream_string_value(std::string_view close_tag, OutputDelta* out) {
  const size_t at = buf_.find(close_tag);
  if (at != std::string::npos) {
    add_arguments(json_escape(std::string_view(buf_).substr(0, at)) + "\"", out);
    buf_.erase(0, at + close_tag.size());
    return true;
  }
  size_t keep = partial_tag_suffix(buf_, close_tag);
  keep += incomplete_utf8_tail(std::string_view(buf_).substr(0, buf_.size() - keep));
  if (buf_.size() > keep) {
    add_arguments(json_escape(std::string_view(buf_).substr(0, buf_.size() - keep)), out);
    buf_.erase(0, buf_.size() - keep);
  }
  return false;
}

void StreamBase::feed(std::string_view chunk, OutputDelta* out) {
  buf_.append(chunk);
  while (step(out)) {
  }
}

void StreamBase::finish(OutputDelta* out) {
  while (step(out)) {
  }
  if (streaming_value()) {
    add_arguments(json_escape(buf_), out);  // the value was cut off: keep what arrived
    buf_.clear();
  }
  if (in_call()) malformed(out);
  out->content += buf_;
  buf_.clear();
}

void StreamBase::add_argument(const std::string& key, std::string_view value, OutputDelta* out) {
  add_arguments(std::string(args_open_ ? ", " : "{") + json_string(key) + ": " + std::string(value), out);
  args_open_ = true;
}

void StreamBase::close_call(OutputDelta* out) {
  add_arguments(args_open_ ? "}" : "{}", out);
  ++next_index_;
}

void StreamBase::abandon_call(bool call_started, OutputDelta* out) {
  if (call_started) {
    const std::string raw = std::move(raw_);
    add_arguments(streaming_value() ? "\"}" : args_open_ ? "}" : "{}", out);
    ++next_index_;
    raw_ = raw;
  }
  out->content += raw_;
  raw_.clear();
}

bool StreamBase::read_value(std::string_view close_tag, const std::string& key, bool streaming,
                            OutputDelta* out) {
  if (streaming) return stream_string_value(close_tag, out);
  const size_t at = buf_.find(close_tag);
  if (at == std::string::npos) return false;
  const std::string value = typed_argument(tools_, current_name_, key, buf_.substr(0, at));
  consume(at + close_tag.size());
  add_argument(key, value, out);
  return true;
}

bool StreamBase::text_until(std::string_view tag, OutputDelta* out) {
  const size_t at = buf_.find(tag);
  if (at != std::string::npos) {
    out->content.append(buf_, 0, at);
    buf_.erase(0, at);
    consume(tag.size());
    return true;
  }
  const size_t keep = partial_tag_suffix(buf_, tag);
  out->content.append(buf_, 0, buf_.size() - keep);
  buf_.erase(0, buf_.size() - keep);
  return false;
}

}  // namespace detail
}  // namespace dsaserve::chat
