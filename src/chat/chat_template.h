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

// A rendered chat cut right after the final message's text, for continuing that message (transformers'
// continue_final_message: the last occurrence of the text; where the template trimmed the text's white space,
// of the trimmed text). Throws dsaserve::Error when the text does not appear.
std::string cut_after_final_message(const std::string& rendered, const std::string& final_text);

// How a template reads an assistant turn of tool calls. OpenAI's clients send that turn's content as null
// and each call's arguments as JSON text; templates written for transformers differ: GLM's takes the
// arguments as an object (it walks their items) and prints a null content as "None", DeepSeek-V3's
// renders the calls only when the content is null and appends the arguments as text. The form is found
// by rendering one such turn each way (as llama.cpp's minja probes a template's capabilities).
struct ToolCallForm {
  bool renders_calls = false;     // some form rendered the call; else the turn passes as sent
  bool null_content = false;      // a turn of tool calls alone keeps a null content (else "")
  bool object_arguments = false;  // the arguments as an object (else their JSON text)
};
ToolCallForm probe_tool_call_form(const ChatTemplate& t);

}  // namespace dsaserve::chat
