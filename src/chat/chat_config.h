#pragma once
// The chat part of a tokenizer folder: special token strings and the chat template(s), read like
// transformers does (tokenizer_config.json, or chat_template.jinja / chat_template.json beside it).
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace dsaserve::chat {

struct ChatConfig {
  // Special tokens as strings (empty when the config does not set them).
  std::string bos_token;
  std::string eos_token;
  std::string pad_token;
  std::string unk_token;
  // Named templates; a config with a single template string stores it as "default".
  std::map<std::string, std::string> templates;

  // Reads DIR/tokenizer_config.json (required) and, when present, DIR/chat_template.jinja or
  // DIR/chat_template.json, which take precedence for the template like in transformers.
  static ChatConfig load(const std::filesystem::path& tokenizer_dir);
  // From parsed tokenizer_config.json content. Token fields may be strings or {"content": ...} objects;
  // chat_template may be a string or a list of {name, template}.
  static ChatConfig from_json(const nlohmann::json& config);

  // transformers' choice: `name` if given and known; else "tool_use" when the request has tools and
  // that template exists; else "default". Throws dsaserve::Error when there is none.
  const std::string& select_template(const std::optional<std::string>& name, bool has_tools) const;

  // The special tokens transformers passes to the template (bos_token, eos_token, ... that are set).
  nlohmann::ordered_json special_tokens() const;
};

}  // namespace dsaserve::chat
