// dsaserve chat-template: render an OpenAI-style chat request with a model's chat template.
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include "chat/chat_config.h"
#include "chat/chat_template.h"
#include "cli/command.h"
#include "cli/stdout_io.h"
#include "core/error.h"

namespace dsaserve::cli {
namespace {

std::string read_all(std::istream& in) {
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::ordered_json parse_json(const std::string& text, const std::string& what) {
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", what, e.what());
  }
}

struct Options {
  std::string tokenizer;
  std::string template_file;
  std::string template_name;
  bool jsonl = false;
};

// --jsonl: one JSON object per input line, one result line per input:
//   {"request": {...}} renders with the chat template; {"template": "...", "context": {...}} renders a raw
//   template; the answer is {"rendered": "..."} or {"error": "<kind>", "message": "..."}.
int run_jsonl(const Options& o, const chat::ChatConfig* config, const std::string* file_template) {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    nlohmann::ordered_json result;
    try {
      auto in = parse_json(line, "input line");
      if (in.contains("template")) {
        chat::Template t(in["template"].get<std::string>());
        result["rendered"] = t.render(in.value("context", nlohmann::ordered_json::object()));
      } else {
        const auto& req = in.at("request");
        if (!config && !file_template) fail("give --tokenizer DIR or --template FILE to render requests");
        const bool has_tools = req.contains("tools") && !req["tools"].is_null();
        const std::string source =
            file_template
                ? *file_template
                : config->select_template(
                      o.template_name.empty() ? std::nullopt : std::optional(o.template_name), has_tools);
        chat::ChatTemplate ct(source, config ? config->special_tokens() : nlohmann::ordered_json::object());
        result["rendered"] = ct.render(req);
      }
    } catch (const chat::TemplateError& e) {
      result["error"] = chat::error_kind_name(e.kind());
      result["message"] = e.what();
    } catch (const std::exception& e) {
      result["error"] = "other";
      result["message"] = e.what();
    }
    // A reader that went away ends the loop with an error instead of rendering the rest of stdin for nobody.
    write_stdout(result.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
  flush_stdout();
  return 0;
}

int run(const Options& o) {
  std::optional<chat::ChatConfig> config;
  if (!o.tokenizer.empty()) config = chat::ChatConfig::load(o.tokenizer);
  std::optional<std::string> file_template;
  if (!o.template_file.empty()) {
    std::ifstream f(o.template_file, std::ios::binary);
    if (!f) fail("cannot read template {}", o.template_file);
    file_template = read_all(f);
  }
  if (o.jsonl) return run_jsonl(o, config ? &*config : nullptr, file_template ? &*file_template : nullptr);
  if (!config && !file_template) fail("give --tokenizer DIR or --template FILE");
  const auto request = parse_json(read_all(std::cin), "request on stdin");
  const bool has_tools = request.is_object() && request.contains("tools") && !request["tools"].is_null();
  const std::string source =
      file_template ? *file_template
                    : config->select_template(
                          o.template_name.empty() ? std::nullopt : std::optional(o.template_name), has_tools);
  chat::ChatTemplate ct(source, config ? config->special_tokens() : nlohmann::ordered_json::object());
  write_stdout(ct.render(request));
  flush_stdout();
  return 0;
}

CommandRegistration reg(
    "chat-template", "Render an OpenAI-style chat request (JSON on stdin) with a chat template",
    [](CLI::App& sub) -> CommandRun {
      auto o = std::make_shared<Options>();
      sub.add_option("--tokenizer", o->tokenizer,
                     "tokenizer folder (tokenizer_config.json: special tokens, chat_template)");
      sub.add_option("--template", o->template_file, "Jinja template file (overrides the config's)");
      sub.add_option("--template-name", o->template_name,
                     "named template of the config (default: 'tool_use' with tools, else 'default')");
      sub.add_flag(
          "--jsonl", o->jsonl,
          "batch mode: one {request} or {template, context} per stdin line, one JSON result per line");
      return [o]() { return run(*o); };
    });

}  // namespace
}  // namespace dsaserve::cli
