// StopMatcher (held-back partial matches) and the OpenAI request validation.
#include "server/stop_matcher.h"

#include <gtest/gtest.h>

#include "server/openai.h"

namespace dsaserve::server {
namespace {

TEST(StopMatcher, HoldsBackPartialMatchesAndCutsAtTheMatch) {
  StopMatcher m({"END", "xyz"});
  EXPECT_EQ(m.feed("hello E"), "hello ");
  EXPECT_EQ(m.feed("N"), "");
  EXPECT_EQ(m.feed("X more"), "ENX more");  // not a match after all: released
  EXPECT_EQ(m.feed(" and EN"), " and ");
  EXPECT_EQ(m.feed("Dtail"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.matched_index(), 0);
  EXPECT_EQ(m.feed("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, EarliestStopWinsAndFlushReleasesTheRest) {
  StopMatcher m({"bc", "ab"});
  EXPECT_EQ(m.feed("xabc"), "x");
  EXPECT_EQ(m.matched_index(), 1);
  StopMatcher n({"stop"});
  EXPECT_EQ(n.feed("a st"), "a ");
  EXPECT_EQ(n.flush(), "st");
  StopMatcher none;
  EXPECT_EQ(none.feed("anything"), "anything");
}

TEST(OpenAI, ValidationNamesFields) {
  using nlohmann::json;
  auto param_of = [](const json& body, bool chat) {
    try {
      chat ? parse_chat_request(body, 100) : parse_completion_request(body, 100);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      return e.param;
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(param_of({{"prompt", "x"}, {"top_p", 0}}, false), "top_p");
  EXPECT_EQ(param_of({{"prompt", "x"}, {"top_k", "5"}}, false), "top_k");
  EXPECT_EQ(param_of({{"prompt", "x"}, {"stop", {1, 2}}}, false), "stop");
  EXPECT_EQ(param_of({{"prompt", "x"}, {"stop_token_ids", {100}}}, false), "stop_token_ids");
  EXPECT_EQ(param_of({{"prompt", "x"}, {"stream_options", 3}}, false), "stream_options");
  EXPECT_EQ(param_of({{"prompt", json::array({"a", "b"})}}, false), "prompt");
  EXPECT_EQ(param_of({{"messages", json::array()}}, true), "messages");
  EXPECT_EQ(param_of({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"top_logprobs", 2}}, true),
            "top_logprobs");
  EXPECT_EQ(
      param_of({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", {{{"type", "function"}}}}},
               true),
      "tools[0].function");
  const GenerationSpec s = parse_completion_request({{"prompt", {1, 2, 3}},
                                                     {"max_tokens", 7},
                                                     {"temperature", 0.5},
                                                     {"logit_bias", {{"5", -100}}},
                                                     {"seed", 9},
                                                     {"stop", "\n"},
                                                     {"n", 3}},
                                                    100);
  EXPECT_EQ(s.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(s.params.max_new_tokens, 7);
  EXPECT_FLOAT_EQ(s.params.temperature, 0.5f);
  ASSERT_EQ(s.params.logit_bias.size(), 1u);
  EXPECT_EQ(s.params.logit_bias[0].first, 5);
  EXPECT_EQ(*s.params.seed, 9u);
  EXPECT_EQ(s.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(s.n, 3);
  const GenerationSpec c = parse_chat_request(
      {{"messages",
        {{{"role", "developer"},
          {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}},
       {"chat_template_kwargs", {{"enable_thinking", false}}}},
      100);
  EXPECT_EQ(c.chat_request["messages"][0]["role"], "system");
  EXPECT_EQ(c.chat_request["messages"][0]["content"], "ab");
  EXPECT_EQ(c.chat_request["chat_template_kwargs"]["enable_thinking"], false);
}

}  // namespace
}  // namespace dsaserve::server
