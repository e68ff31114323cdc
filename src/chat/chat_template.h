#pragma once
// ChatTemplate: renders OpenAI-style chat requests into prompts with a model's Jinja chat template,
// with the variables transformers' apply_chat_template passes (messages, tools, documents,
// add_generation_prompt, the special tokens and chat_template_kwargs).
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/chat_config.h"
#include "chat/template.h"

namespace dsaserve::chat {

class ChatTemplate {
 public:
  // Parses the template once; `special_tokens` (bos_token, eos_token, ...) become template variables.
  ChatTemplate(const std::string& source, nlohmann::ordered_json special_tokens,
               TemplateOptions options = {});
  // The template the config selects ("default", or "tool_use" for requests with tools when has_tools).
  static ChatTemplate from_config(const ChatConfig& config, bool has_tools = false);

  // request: {"messages": [...], "tools": [...]?, "add_generation_prompt": bool?, "documents": ...?,
  // "chat_template_kwargs": {...}?}. Throws TemplateError / dsaserve::Error.
  std::string render(const nlohmann::ordered_json& request) const;

  const Template& compiled() const { return *template_; }

 private:
  std::shared_ptr<const Template> template_;
  nlohmann::ordered_json special_tokens_;
};

}  // namespace dsaserve::chat
