#pragma once
// Template: a Jinja template parsed once and rendered many times (render is const and thread safe).
// The semantics follow jinja2's ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with
// the loopcontrols extension, as transformers' apply_chat_template uses it, including transformers'
// tojson (ensure_ascii=False, indent, separators, sort_keys), raise_exception and strftime_now.
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/ast.h"
#include "chat/template_error.h"
#include "chat/value.h"

namespace dsaserve::chat {

struct TemplateOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
  // false: like ImmutableSandboxedEnvironment, list.append/pop/... raise a security error.
  bool allow_mutation = false;
  // Source of "now" for strftime_now (seconds since the epoch); default: the system clock.
  std::function<int64_t()> clock;
  // The bytes of string values one render may produce or copy (every expression's string result, the
  // output), and 64 a loop iteration: past it the render is a runtime error. A template that grows a string
  // once per message (DeepSeek-V3's `ns.system_prompt + message['content']`) does quadratic work in the
  // number of messages: 60,000 system messages in an 8 MB request rendered for 4 minutes. Templates run on
  // what clients send, so the work is bounded like the request.
  int64_t max_work_bytes = int64_t(512) << 20;
};

class Template {
 public:
  // Parses `source`; throws TemplateError (kind syntax) with line and column.
  explicit Template(const std::string& source, TemplateOptions options = {});

  // Renders with the variables of `context` (a dict); throws TemplateError naming line and column.
  std::string render(const Value& context) const;
  std::string render(const nlohmann::ordered_json& context) const;

  const TemplateOptions& options() const { return options_; }

 private:
  TemplateOptions options_;
  std::shared_ptr<const Body> body_;
};

}  // namespace dsaserve::chat
