#include "chat/chat_template.h"

#include "core/error.h"

namespace dsaserve::chat {

ChatTemplate::ChatTemplate(const std::string& source, nlohmann::ordered_json special_tokens,
                           TemplateOptions options)
    : template_(std::make_shared<const Template>(source, std::move(options))),
      special_tokens_(std::move(special_tokens)) {}

ChatTemplate ChatTemplate::from_config(const ChatConfig& config, bool has_tools) {
  return ChatTemplate(config.select_template(std::nullopt, has_tools), config.special_tokens());
}

std::string ChatTemplate::render(const nlohmann::ordered_json& request) const {
  if (!request.is_object()) fail("chat request must be a JSON object");
  auto messages = request.find("messages");
  if (messages == request.end() || !messages->is_array()) fail("chat request: 'messages' must be a list");
  Value ctx = Value::dict();
  auto& d = ctx.dict_data();
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it)
    d.set(Value(it.key()), Value::from_json(it.value()));
  d.set(Value("messages"), Value::from_json(*messages));
  auto get = [&](const char* key) {
    auto it = request.find(key);
    return it == request.end() ? Value::none() : Value::from_json(*it);
  };
  d.set(Value("tools"), get("tools"));
  d.set(Value("documents"), get("documents"));
  auto agp = request.find("add_generation_prompt");
  d.set(Value("add_generation_prompt"),
        Value(agp != request.end() && agp->is_boolean() ? agp->get<bool>() : false));
  if (auto kw = request.find("chat_template_kwargs"); kw != request.end() && !kw->is_null()) {
    if (!kw->is_object()) fail("chat request: 'chat_template_kwargs' must be an object");
    for (auto it = kw->begin(); it != kw->end(); ++it) d.set(Value(it.key()), Value::from_json(it.value()));
  }
  return template_->render(ctx);
}

}  // namespace dsaserve::chat
