// Golden test: every case of fixtures/text/chat_cases.jsonl (rendered by transformers) must render
// byte-identical with the fixture templates and the DeepSeek tokenizer's special tokens.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "chat/chat_config.h"
#include "chat/chat_template.h"
#include "common/fixtures.h"

namespace dsaserve::chat {
namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(ChatCases, AllCasesRenderByteExact) {
  DSA_FIXTURE_PATH(cases_path, "text/chat_cases.jsonl");
  DSA_FIXTURE_PATH(tokenizer_dir, "tokenizers/deepseek_v3");
  const ChatConfig config = ChatConfig::load(tokenizer_dir);
  std::map<std::string, std::unique_ptr<ChatTemplate>> templates;
  std::ifstream in(cases_path);
  std::string line;
  int total = 0, failed = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto c = nlohmann::ordered_json::parse(line);
    const std::string name = c["template"].get<std::string>();
    if (!templates.count(name)) {
      const auto path = ::dsaserve::testing::fixtures_dir() / "templates" / (name + ".jinja");
      ASSERT_TRUE(std::filesystem::exists(path)) << path;
      templates[name] = std::make_unique<ChatTemplate>(read_file(path), config.special_tokens());
    }
    nlohmann::ordered_json request = {{"messages", c["messages"]},
                                      {"tools", c["tools"]},
                                      {"add_generation_prompt", c["add_generation_prompt"]},
                                      {"chat_template_kwargs", c["kwargs"]}};
    ++total;
    std::string got;
    try {
      got = templates[name]->render(request);
    } catch (const std::exception& e) {
      got = std::string("<error> ") + e.what();
    }
    const std::string want = c["rendered"].get<std::string>();
    if (got != want) {
      ++failed;
      ADD_FAILURE() << "template " << name << " case " << c["case"].get<std::string>() << "\n--- want\n"
                    << want << "\n--- got\n"
                    << got;
    }
  }
  EXPECT_GT(total, 0);
  EXPECT_EQ(failed, 0) << failed << " of " << total << " cases differ";
}

TEST(ChatCases, TokenizerConfigTemplateMatchesFixture) {
  DSA_FIXTURE_PATH(tokenizer_dir, "tokenizers/deepseek_v3");
  DSA_FIXTURE_PATH(template_path, "templates/deepseek_v3.jinja");
  const ChatConfig config = ChatConfig::load(tokenizer_dir);
  EXPECT_EQ(config.bos_token, "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(config.eos_token, "<｜end▁of▁sentence｜>");
  EXPECT_EQ(config.pad_token, "<｜end▁of▁sentence｜>");
  const ChatTemplate from_config = ChatTemplate::from_config(config);
  const ChatTemplate from_file(read_file(template_path), config.special_tokens());
  const nlohmann::ordered_json req = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                      {"add_generation_prompt", true}};
  EXPECT_EQ(from_config.render(req), from_file.render(req));
  EXPECT_EQ(from_config.render(req), "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜>");
}

// How each template reads a turn of tool calls, found by rendering one each way: GLM's walks the arguments
// as an object (and prints a null content as "None"), DeepSeek-V3's renders calls only under a null content
// and appends the arguments' text; a template that re-encodes them (tojson) takes the object, one that
// prints them takes the text, and one that never shows calls is left as sent.
TEST(ChatCases, ToolCallFormOfEachTemplate) {
  DSA_FIXTURE_PATH(tokenizer_dir, "tokenizers/deepseek_v3");
  const ChatConfig config = ChatConfig::load(tokenizer_dir);
  auto form = [&](const std::string& source) {
    const ToolCallForm f = probe_tool_call_form(ChatTemplate(source, config.special_tokens()));
    return std::tuple(f.renders_calls, f.null_content, f.object_arguments);
  };
  const auto dir = ::dsaserve::testing::fixtures_dir() / "templates";
  EXPECT_EQ(form(read_file(dir / "glm_4_6.jinja")), std::tuple(true, false, true));
  EXPECT_EQ(form(read_file(dir / "deepseek_v3.jinja")), std::tuple(true, true, false));
  const std::string loop = "{% for m in messages %}{{ m.content }}{% for c in m.tool_calls or [] %}";
  EXPECT_EQ(form(loop + "{{ c.function.name }}{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}"),
            std::tuple(true, false, true));
  EXPECT_EQ(form(loop + "{{ c.function.name }}{{ c.function.arguments }}{% endfor %}{% endfor %}"),
            std::tuple(true, false, false));
  EXPECT_EQ(form("{% for m in messages %}{{ m.content }}{% endfor %}"), std::tuple(false, false, false));
}

}  // namespace
}  // namespace dsaserve::chat
