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

std::string cut_after_final_message(const std::string& rendered, const std::string& final_text) {
  if (const size_t at = rendered.rfind(final_text); at != std::string::npos)
    return rendered.substr(0, at + final_text.size());
  constexpr const char* kSpace = " \t\n\r\v\f";
  const size_t first = final_text.find_first_not_of(kSpace);
  const size_t last = final_text.find_last_not_of(kSpace);
  const std::string lstripped = first == std::string::npos ? "" : final_text.substr(first);
  const std::string stripped = first == std::string::npos ? "" : final_text.substr(first, last - first + 1);
  const size_t at = rendered.rfind(stripped);
  if (at == std::string::npos) {
    fail(
        "continue_final_message: the final message does not appear in the rendered chat (the chat template "
        "changes it)");
  }
  // The template kept the trailing white space (the text's leading white space was what it trimmed) or not.
  if (rendered.compare(at, lstripped.size(), lstripped) == 0)
    return rendered.substr(0, at + lstripped.size());
  return rendered.substr(0, at + stripped.size());
}

ToolCallForm probe_tool_call_form(const ChatTemplate& t) {
  using nlohmann::ordered_json;
  const std::string args_text = R"({"probe_key": "probe_value"})";
  // Tried in this order; the first whose output shows the call (its name, and its arguments: verbatim
  // when given as text, so a template that re-encodes text as JSON takes the object) wins.
  for (const bool null_content : {false, true}) {
    for (const bool object_arguments : {false, true}) {
      ordered_json call = {
          {"id", "call_probe"},
          {"type", "function"},
          {"function",
           {{"name", "probe_call_name"},
            {"arguments", object_arguments ? ordered_json::parse(args_text) : ordered_json(args_text)}}}};
      ordered_json request = {
          {"messages",
           ordered_json::array({{{"role", "user"}, {"content", "probe"}},
                                {{"role", "assistant"},
                                 {"content", null_content ? ordered_json(nullptr) : ordered_json("")},
                                 {"tool_calls", ordered_json::array({call})}},
                                {{"role", "tool"}, {"tool_call_id", "call_probe"}, {"content", "probe"}}})},
          {"add_generation_prompt", true}};
      std::string out;
      try {
        out = t.render(request);
      } catch (const std::exception&) {
        continue;
      }
      const bool shown = out.find("probe_call_name") != std::string::npos &&
                         (object_arguments ? out.find("probe_key") != std::string::npos &&
                                                 out.find("probe_value") != std::string::npos
                                           : out.find(args_text) != std::string::npos) &&
                         out.find("None") == std::string::npos;
      if (shown) return ToolCallForm{true, null_content, object_arguments};
    }
  }
  return ToolCallForm{};
}

}  // namespace dsaserve::chat
