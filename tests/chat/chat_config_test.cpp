// tokenizer_config.json chat settings: token forms, template lists and transformers' template choice.
#include "chat/chat_config.h"

#include <gtest/gtest.h>

#include "chat/chat_template.h"
#include "core/error.h"

namespace dsaserve::chat {
namespace {

TEST(ChatConfig, TokenStringsAndObjects) {
  const auto c = ChatConfig::from_json(nlohmann::json::parse(
      R"({"bos_token": "<s>", "eos_token": {"__type": "AddedToken", "content": "</s>"}, "pad_token": null,
          "chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"})"));
  EXPECT_EQ(c.bos_token, "<s>");
  EXPECT_EQ(c.eos_token, "</s>");
  EXPECT_EQ(c.pad_token, "");
  ASSERT_EQ(c.templates.count("default"), 1u);
  const ChatTemplate t = ChatTemplate::from_config(c);
  EXPECT_EQ(t.render(nlohmann::ordered_json::parse(R"({"messages": [{"role": "user", "content": "x"}]})")),
            "<s>x</s>");
}

TEST(ChatConfig, NamedTemplatesSelectLikeTransformers) {
  const auto c = ChatConfig::from_json(nlohmann::json::parse(
      R"({"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"},
                            {"name": "rag", "template": "R"}]})"));
  EXPECT_EQ(c.select_template(std::nullopt, false), "D");
  EXPECT_EQ(c.select_template(std::nullopt, true), "T");
  EXPECT_EQ(c.select_template(std::string("rag"), true), "R");
  EXPECT_THROW(c.select_template(std::string("nope"), false), dsaserve::Error);
  const auto only_tools = ChatConfig::from_json(
      nlohmann::json::parse(R"({"chat_template": [{"name": "tool_use", "template": "T"}]})"));
  EXPECT_THROW(only_tools.select_template(std::nullopt, false), dsaserve::Error);
  EXPECT_THROW(ChatConfig::from_json(nlohmann::json::parse(R"({})")).select_template(std::nullopt, false),
               dsaserve::Error);
}

TEST(ChatConfig, BadConfigsAreErrors) {
  EXPECT_THROW(ChatConfig::from_json(nlohmann::json::parse(R"({"chat_template": 5})")), dsaserve::Error);
  EXPECT_THROW(ChatConfig::from_json(nlohmann::json::parse(R"({"chat_template": [{"name": 1}]})")),
               dsaserve::Error);
  EXPECT_THROW(ChatConfig::from_json(nlohmann::json::parse(R"({"bos_token": 3})")), dsaserve::Error);
  EXPECT_THROW(ChatConfig::load("/nonexistent/dir"), dsaserve::Error);
}

TEST(ChatTemplate, RequestVariables) {
  const ChatTemplate t(
      "{{ tools is none }}|{{ add_generation_prompt }}|{{ enable_thinking is defined }}|{{ documents is none "
      "}}|{{ bos_token }}",
      nlohmann::ordered_json{{"bos_token", "<B>"}});
  EXPECT_EQ(t.render(nlohmann::ordered_json::parse(R"({"messages": []})")), "True|False|False|True|<B>");
  EXPECT_EQ(
      t.render(nlohmann::ordered_json::parse(
          R"({"messages": [], "tools": [], "add_generation_prompt": true, "chat_template_kwargs": {"enable_thinking": false}})")),
      "False|True|True|True|<B>");
  EXPECT_THROW(t.render(nlohmann::ordered_json::parse(R"({"messages": 3})")), dsaserve::Error);
  EXPECT_THROW(t.render(nlohmann::ordered_json::parse(R"([1])")), dsaserve::Error);
}

}  // namespace
}  // namespace dsaserve::chat
