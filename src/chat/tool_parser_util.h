#pragma once
// Shared pieces of the streaming tool-call parsers (internal to the chat module).
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "chat/output_parser.h"

namespace dsaserve::chat::detail {

// Length of the longest proper prefix of `tag` that `text` ends with (text that must be held back
// because the next chunk may complete the tag).
size_t partial_tag_suffix(std::string_view text, std::string_view tag);

enum class Match { kYes, kPartial, kNo };
// Does `text`, after `*ws` leading whitespace bytes, start with `tag`? kPartial: it could, once more
// text arrives.
Match match_after_whitespace(std::string_view text, std::string_view tag, size_t* ws);

std::string trim(std::string_view s);
std::string json_string(std::string_view s);
// The inside of a JSON string literal for UTF-8 text `s` (no quotes).
std::string json_escape(std::string_view s);
// Is the schema type of tool `tool`'s parameter `key` a string?
bool is_string_argument(const nlohmann::json& tools, const std::string& tool, const std::string& key);

// JSON text of argument `key` of tool `tool` from its raw text, typed by the tool's JSON schema:
// string-typed -> JSON string of the raw text; otherwise the JSON the text parses as (Python literals
// True/False/None accepted), else a JSON string.
std::string typed_argument(const nlohmann::json& tools, const std::string& tool, const std::string& key,
                           const std::string& raw);

// State shared by the parsers: unconsumed input and the consumed-but-uncommitted text of the call in
// progress (returned as content if the call turns out malformed).
class StreamBase : public ToolCallParser {
 public:
  StreamBase(nlohmann::json tools, ToolCallIdGenerator make_id)
      : tools_(std::move(tools)), make_id_(std::move(make_id)) {}

 protected:
  void consume(size_t n) {
    raw_.append(buf_, 0, n);
    buf_.erase(0, n);
  }
  // Starts call `next_index_` with `name`: the first delta (id and name).
  void open_call(const std::string& name, OutputDelta* out);
  void add_arguments(const std::string& fragment, OutputDelta* out);
  // Emits the text after the tag-free part of buf_ as content, keeping a possible partial tag.
  void emit_text_until(std::string_view tag, OutputDelta* out, bool* found);
  // Streams a string-typed argument value: the JSON-escaped text before `close_tag` (holding back a
  // possible partial tag and incomplete UTF-8) as argument fragments. True once the tag was consumed
  // (the closing quote emitted).
  bool stream_string_value(std::string_view close_tag, OutputDelta* out);

  nlohmann::json tools_;
  ToolCallIdGenerator make_id_;
  std::string buf_;
  std::string raw_;
  std::string current_name_;
  int next_index_ = 0;
};

}  // namespace dsaserve::chat::detail
