#include "chat/chat_config.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace dsaserve::chat {
namespace {

std::string token_string(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  fail("tokenizer config: '{}' must be a string or an object with 'content'", key);
}

void read_templates(const nlohmann::json& value, std::map<std::string, std::string>& out, const char* where) {
  out.clear();
  if (value.is_string()) {
    out["default"] = value.get<std::string>();
    return;
  }
  if (value.is_array()) {
    for (const auto& entry : value) {
      if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
          !entry["name"].is_string() || !entry["template"].is_string()) {
        fail("{}: chat_template list entries must be {{\"name\": str, \"template\": str}}", where);
      }
      out[entry["name"].get<std::string>()] = entry["template"].get<std::string>();
    }
    return;
  }
  if (!value.is_null()) fail("{}: chat_template must be a string or a list of {{name, template}}", where);
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail("cannot read {}", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

ChatConfig ChatConfig::from_json(const nlohmann::json& config) {
  if (!config.is_object()) fail("tokenizer config must be a JSON object");
  ChatConfig c;
  c.bos_token = token_string(config, "bos_token");
  c.eos_token = token_string(config, "eos_token");
  c.pad_token = token_string(config, "pad_token");
  c.unk_token = token_string(config, "unk_token");
  if (auto it = config.find("chat_template"); it != config.end())
    read_templates(*it, c.templates, "tokenizer config");
  return c;
}

ChatConfig ChatConfig::load(const std::filesystem::path& dir) {
  const auto path = dir / "tokenizer_config.json";
  if (!std::filesystem::exists(path)) fail("{} not found", path.string());
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", path.string(), e.what());
  }
  ChatConfig c = from_json(config);
  if (std::filesystem::exists(dir / "chat_template.jinja")) {
    c.templates.clear();
    c.templates["default"] = read_file(dir / "chat_template.jinja");
  } else if (std::filesystem::exists(dir / "chat_template.json")) {
    try {
      auto j = nlohmann::json::parse(read_file(dir / "chat_template.json"));
      if (j.is_object() && j.contains("chat_template"))
        read_templates(j["chat_template"], c.templates, "chat_template.json");
    } catch (const nlohmann::json::exception& e) {
      fail("{}: invalid JSON: {}", (dir / "chat_template.json").string(), e.what());
    }
  }
  return c;
}

const std::string& ChatConfig::select_template(const std::optional<std::string>& name, bool has_tools) const {
  if (name) {
    auto it = templates.find(*name);
    if (it == templates.end()) fail("chat template '{}' not found in the tokenizer config", *name);
    return it->second;
  }
  if (has_tools) {
    auto it = templates.find("tool_use");
    if (it != templates.end()) return it->second;
  }
  auto it = templates.find("default");
  if (it == templates.end()) {
    if (templates.empty()) fail("the tokenizer config has no chat_template; pass one explicitly");
    fail("the tokenizer config has no 'default' chat template; pass a template name");
  }
  return it->second;
}

nlohmann::ordered_json ChatConfig::special_tokens() const {
  nlohmann::ordered_json t = nlohmann::ordered_json::object();
  if (!bos_token.empty()) t["bos_token"] = bos_token;
  if (!eos_token.empty()) t["eos_token"] = eos_token;
  if (!unk_token.empty()) t["unk_token"] = unk_token;
  if (!pad_token.empty()) t["pad_token"] = pad_token;
  return t;
}

}  // namespace dsaserve::chat
