// issue 17 through the real binary: `dsaserve serve --speculative-algorithm EAGLE --speculative-num-steps N
// --speculative-eagle-topk 1 --speculative-num-draft-tokens N+1` answers greedy completions with the same
// token ids as the same server without speculation: 8 concurrent requests with chunked prefill on a small
// pool (retractions), a repeated prompt (prefix-cache hit), on tiny (steps 1, 3, 5), realdims and
// realdims_fp8 (steps 3); /metrics carries the accept counters and histogram; a client that disconnects
// mid-stream leaves no page behind (--check-integrity runs every step). Sampled, penalised, logprob and
// constrained requests: ServeSpecSampling below; grammar-constrained greedy requests give the same text
// with and without speculation: ServeSpecGrammar.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "server/server_process.h"  // tests/server/

namespace dsaserve::testing {
namespace {

using nlohmann::json;

struct SpecCase {
  const char* model;
  int steps;
};

class ServeSpec : public ::testing::TestWithParam<SpecCase> {};

std::vector<std::string> server_args(const std::filesystem::path& dir, int steps) {
  std::vector<std::string> a = {"--model",
                                dir.string(),
                                "--tokenizer",
                                "builtin:bytes",
                                "--kv-pages",
                                "48",
                                "--page-size",
                                "4",
                                "--chunked-prefill-size",
                                "16",
                                "--max-running-requests",
                                "8",
                                "--check-integrity",
                                "--served-model-name",
                                "m"};
  if (steps > 0) {
    for (const std::string& s : {std::string("--speculative-algorithm"), std::string("EAGLE"),
                                 std::string("--speculative-num-steps"), std::to_string(steps),
                                 std::string("--speculative-eagle-topk"), std::string("1"),
                                 std::string("--speculative-num-draft-tokens"), std::to_string(steps + 1)})
      a.push_back(s);
  }
  return a;
}

// Token ids of greedy completions of `prompts`, sent concurrently.
std::vector<std::vector<int32_t>> complete_all(int port, const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<HttpResult> res(prompts.size());
  std::vector<std::thread> th;
  for (size_t i = 0; i < prompts.size(); ++i) {
    th.emplace_back([&, i] {
      const json b = {{"model", "m"},     {"prompt", prompts[i]}, {"max_tokens", 12 + 2 * i},
                      {"temperature", 0}, {"ignore_eos", true},   {"return_token_ids", true}};
      res[i] = post_json(port, "/v1/completions", b);
    });
  }
  for (auto& t : th) t.join();
  std::vector<std::vector<int32_t>> out;
  for (const HttpResult& r : res) {
    EXPECT_EQ(r.status, 200) << r.body;
    out.push_back(r.status == 200 ? r.json()["choices"][0]["token_ids"].get<std::vector<int32_t>>()
                                  : std::vector<int32_t>{});
  }
  return out;
}

void expect_no_leak(int port) {
  for (int i = 0; i < 100; ++i) {
    const std::string m = http_request(port, "GET", "/metrics").body;
    if (metric(m, "dsaserve_num_running_requests") == 0 && metric(m, "dsaserve_num_waiting_requests") == 0 &&
        metric(m, "dsaserve_kv_pages_used") == metric(m, "dsaserve_prefix_cache_pages"))
      return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "pages not released";
}

TEST_P(ServeSpec, GreedyTokensEqualTheServerWithoutSpeculation) {
  DSA_FIXTURE_PATH(models, "models");
  const SpecCase c = GetParam();
  const auto dir = models / c.model;
  std::mt19937 rng(uint32_t(7 + c.steps));
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p;
    for (uint32_t k = 0, n = 3 + rng() % 40; k < n; ++k) p.push_back(int32_t(rng() % 500));
    prompts.push_back(std::move(p));
  }
  ServerProcess plain(server_args(dir, 0));
  ASSERT_GT(plain.port(), 0) << plain.log();
  // One prompt alone, then again (a prefix-cache hit), then all 8 at once (retractions on 48 pages).
  const auto want_one = complete_all(plain.port(), {prompts[0]});
  EXPECT_EQ(complete_all(plain.port(), {prompts[0]}), want_one);
  const auto want = complete_all(plain.port(), prompts);

  ServerProcess spec(server_args(dir, c.steps));
  ASSERT_GT(spec.port(), 0) << spec.log();
  EXPECT_EQ(complete_all(spec.port(), {prompts[0]}), want_one);
  EXPECT_EQ(complete_all(spec.port(), {prompts[0]}), want_one) << "prefix-cache hit";
  EXPECT_GT(
      metric(http_request(spec.port(), "GET", "/metrics").body, "dsaserve_prefix_cache_hit_tokens_total"), 0);
  EXPECT_EQ(complete_all(spec.port(), prompts), want) << c.model << " steps " << c.steps;
  const std::string m = http_request(spec.port(), "GET", "/metrics").body;
  EXPECT_GT(metric(m, "dsaserve_spec_draft_tokens_total"), 0);
  EXPECT_GT(metric(m, "dsaserve_spec_verify_rounds_total"), 0);
  EXPECT_EQ(metric(m, "dsaserve_spec_draft_tokens_total"),
            c.steps * metric(m, "dsaserve_spec_verify_rounds_total"));
  EXPECT_EQ(metric(m, "dsaserve_spec_accept_length_count"), metric(m, "dsaserve_spec_verify_rounds_total"));
  EXPECT_GT(metric(m, "dsaserve_retractions_total"), 0);
  fmt::print("serve {} steps={}: {} rounds, {} accepted of {} drafted, {} retractions\n", c.model, c.steps,
             metric(m, "dsaserve_spec_verify_rounds_total"), metric(m, "dsaserve_spec_accepted_tokens_total"),
             metric(m, "dsaserve_spec_draft_tokens_total"), metric(m, "dsaserve_retractions_total"));
  expect_no_leak(spec.port());

  // A streaming client that goes away mid-generation.
  namespace net = boost::asio;
  net::io_context ioc;
  net::ip::tcp::socket sock(ioc);
  sock.connect({net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(spec.port())});
  const std::string body =
      json{{"prompt", "abc"}, {"max_tokens", 150}, {"temperature", 0}, {"ignore_eos", true}, {"stream", true}}
          .dump();
  net::write(sock, net::buffer(fmt::format("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                           "application/json\r\nContent-Length: {}\r\n\r\n{}",
                                           body.size(), body)));
  std::string got;
  char buf[1024];
  while (got.find("data: ") == std::string::npos) got.append(buf, sock.read_some(net::buffer(buf)));
  sock.close();
  expect_no_leak(spec.port());
  EXPECT_EQ(spec.stop(), 0) << spec.log();
  EXPECT_EQ(plain.stop(), 0);
}

// Sampled, penalised, logprob and constrained requests on a speculative server (tiny, steps 3): seeded
// sampled completions reproduce and carry usage.spec_verify_ct / spec_accept_length; greedy ones with a
// frequency penalty, logit_bias and logprobs equal the plain server's tokens and logprobs; sampled
// json_object requests speculate (spec usage, rounds) and stay valid JSON; streaming sampled clients that
// disconnect while rounds run leave no page behind (--check-integrity every step).
TEST(ServeSpecSampling, SampledPenalisedConstrainedAndDisconnects) {
  DSA_FIXTURE_PATH(tiny, "models/tiny");
  ServerProcess plain(server_args(tiny, 0));
  ServerProcess spec(server_args(tiny, 3));
  ASSERT_GT(plain.port(), 0) << plain.log();
  ASSERT_GT(spec.port(), 0) << spec.log();
  const json sampled = {
      {"model", "m"}, {"prompt", {5, 6, 7, 8}}, {"max_tokens", 24}, {"temperature", 1.0},
      {"seed", 11},   {"ignore_eos", true},     {"logprobs", 1},    {"return_token_ids", true}};
  const HttpResult a = post_json(spec.port(), "/v1/completions", sampled);
  const HttpResult b = post_json(spec.port(), "/v1/completions", sampled);
  ASSERT_EQ(a.status, 200) << a.body;
  ASSERT_EQ(b.status, 200) << b.body;
  EXPECT_EQ(a.json()["choices"][0]["token_ids"], b.json()["choices"][0]["token_ids"])
      << "seeded: reproducible";
  EXPECT_EQ(a.json()["choices"][0]["token_ids"].size(), 24u);
  const json u = a.json()["usage"];
  ASSERT_TRUE(u.contains("spec_verify_ct")) << a.body;
  EXPECT_GT(u["spec_verify_ct"].get<int64_t>(), 0);
  EXPECT_GE(u["spec_accept_length"].get<double>(), 1.0);
  EXPECT_LE(u["spec_accept_length"].get<double>(), 4.0);
  EXPECT_EQ(a.json()["choices"][0]["logprobs"]["token_logprobs"].size(), 24u);
  EXPECT_FALSE(
      post_json(plain.port(), "/v1/completions", sampled).json()["usage"].contains("spec_verify_ct"));

  json greedy = {{"model", "m"},
                 {"prompt", {9, 10, 11, 12, 13}},
                 {"max_tokens", 20},
                 {"temperature", 0},
                 {"frequency_penalty", 1.2},
                 {"logit_bias", {{"7", 3.0}}},
                 {"ignore_eos", true},
                 {"logprobs", 2},
                 {"return_token_ids", true}};
  const HttpResult gp = post_json(plain.port(), "/v1/completions", greedy);
  const HttpResult gs = post_json(spec.port(), "/v1/completions", greedy);
  ASSERT_EQ(gp.status, 200) << gp.body;
  ASSERT_EQ(gs.status, 200) << gs.body;
  EXPECT_EQ(gs.json()["choices"][0]["token_ids"], gp.json()["choices"][0]["token_ids"]);
  const json lp = gp.json()["choices"][0]["logprobs"]["token_logprobs"];
  const json ls = gs.json()["choices"][0]["logprobs"]["token_logprobs"];
  ASSERT_EQ(lp.size(), ls.size());
  for (size_t i = 0; i < lp.size(); ++i) EXPECT_NEAR(ls[i].get<double>(), lp[i].get<double>(), 1e-4) << i;
  EXPECT_GT(gs.json()["usage"]["spec_verify_ct"].get<int64_t>(), 0);

  const double rounds =
      metric(http_request(spec.port(), "GET", "/metrics").body, "dsaserve_spec_verify_rounds_total");
  for (int seed = 1; seed <= 4; ++seed) {
    const json constrained = {{"model", "m"},     {"prompt", "JSON:"},
                              {"max_tokens", 40}, {"temperature", 1.0},
                              {"seed", seed},     {"response_format", {{"type", "json_object"}}}};
    const HttpResult c = post_json(spec.port(), "/v1/completions", constrained);
    ASSERT_EQ(c.status, 200) << c.body;
    EXPECT_GT(c.json()["usage"].value("spec_verify_ct", 0), 0)
        << "a constrained request speculates: " << c.body;
    const json cc = c.json()["choices"][0];
    if (cc["finish_reason"] == "stop") {
      EXPECT_TRUE(json::parse(cc["text"].get<std::string>(), nullptr, false).is_object()) << c.body;
    }
  }
  EXPECT_GT(metric(http_request(spec.port(), "GET", "/metrics").body, "dsaserve_spec_verify_rounds_total"),
            rounds);
  expect_no_leak(spec.port());

  // 8 streaming sampled clients that go away after 1..8 events, while rounds run for the others.
  namespace net = boost::asio;
  std::vector<std::thread> th;
  for (int i = 0; i < 8; ++i) {
    th.emplace_back([&, i] {
      net::io_context ioc;
      net::ip::tcp::socket sock(ioc);
      sock.connect({net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(spec.port())});
      const std::string body =
          json{{"prompt", {1 + i, 2, 3}}, {"max_tokens", 200}, {"temperature", 1.0}, {"seed", i},
               {"ignore_eos", true},      {"stream", true}}
              .dump();
      net::write(sock, net::buffer(fmt::format("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                               "application/json\r\nContent-Length: {}\r\n\r\n{}",
                                               body.size(), body)));
      std::string got;
      char buf[512];
      size_t events = 0;
      while (events < size_t(1 + i)) {
        got.append(buf, sock.read_some(net::buffer(buf)));
        events = 0;
        for (size_t at = got.find("data: "); at != std::string::npos; at = got.find("data: ", at + 1))
          ++events;
      }
      sock.close();
    });
  }
  for (auto& t : th) t.join();
  expect_no_leak(spec.port());
  const std::string m = http_request(spec.port(), "GET", "/metrics").body;
  EXPECT_GT(metric(m, "dsaserve_spec_verify_rounds_total"), rounds);
  EXPECT_EQ(spec.stop(), 0) << spec.log();
  EXPECT_EQ(plain.stop(), 0);
}

// Grammar-constrained greedy requests on the built-in model (--tool-call-parser / --reasoning-parser
// glm45) with `--speculative-algorithm EAGLE --speculative-num-steps 3`: response_format json_schema on
// both endpoints and a forced tool call behind a reasoning block that spends its whole budget give the
// plain server's text and tool call; they ran speculative rounds; no page is left behind.
TEST(ServeSpecGrammar, ConstrainedGreedyTextEqualsTheServerWithoutSpeculation) {
  std::vector<std::string> args = {
      "--model", "builtin:demo",     "--kv-pages", "64", "--tool-call-parser", "glm45", "--reasoning-parser",
      "glm45",   "--check-integrity"};
  ServerProcess plain(args);
  for (const char* a : {"--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"})
    args.push_back(a);
  ServerProcess spec(args);
  ASSERT_GT(plain.port(), 0) << plain.log();
  ASSERT_GT(spec.port(), 0) << spec.log();
  const json schema = json::parse(R"({"type": "object", "properties": {"city": {"type": "string",
      "enum": ["Paris", "Tokyo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
      "note": {"type": "string", "maxLength": 5}}, "required": ["city", "days", "note"]})");
  const json format = {{"type", "json_schema"}, {"json_schema", {{"name", "w"}, {"schema", schema}}}};
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]},
      "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}}}])");
  const json messages = json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}});
  const std::vector<std::pair<std::string, json>> requests = {
      {"/v1/chat/completions",
       {{"messages", messages}, {"max_tokens", 120}, {"temperature", 0}, {"response_format", format}}},
      {"/v1/completions",
       {{"prompt", "JSON:"}, {"max_tokens", 120}, {"temperature", 0}, {"response_format", format}}},
      {"/v1/chat/completions",
       {{"messages", messages},
        {"max_tokens", 300},  // the reasoning budget (128 tokens) runs out, then the call completes
        {"temperature", 0},
        {"tools", tools},
        {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}},
  };
  for (const auto& [path, body] : requests) {
    const HttpResult a = post_json(plain.port(), path, body);
    const HttpResult b = post_json(spec.port(), path, body);
    ASSERT_EQ(a.status, 200) << a.body;
    ASSERT_EQ(b.status, 200) << b.body;
    const json ca = a.json()["choices"][0], cb = b.json()["choices"][0];
    EXPECT_EQ(cb["finish_reason"], ca["finish_reason"]) << b.body;
    if (body.contains("tools")) {
      EXPECT_EQ(ca["finish_reason"], "tool_calls") << a.body;
    }
    if (path == "/v1/completions") {
      EXPECT_EQ(cb["text"], ca["text"]) << b.body;
    } else {
      EXPECT_EQ(cb["message"]["content"], ca["message"]["content"]) << b.body;
      EXPECT_EQ(cb["message"].value("reasoning_content", json()),
                ca["message"].value("reasoning_content", json()));
      ASSERT_EQ(cb["message"].contains("tool_calls"), ca["message"].contains("tool_calls")) << b.body;
      if (ca["message"].contains("tool_calls")) {
        ASSERT_EQ(cb["message"]["tool_calls"].size(), ca["message"]["tool_calls"].size());
        for (size_t i = 0; i < ca["message"]["tool_calls"].size(); ++i)
          EXPECT_EQ(cb["message"]["tool_calls"][i]["function"], ca["message"]["tool_calls"][i]["function"]);
      }
    }
    EXPECT_EQ(b.json()["usage"]["completion_tokens"], a.json()["usage"]["completion_tokens"]);
    EXPECT_GT(b.json()["usage"].value("spec_verify_ct", 0), 0) << b.body;
    fmt::print("serve grammar spec {}: {} tokens, {} rounds, accept length {}\n", path,
               b.json()["usage"]["completion_tokens"].dump(), b.json()["usage"]["spec_verify_ct"].dump(),
               b.json()["usage"].value("spec_accept_length", json()).dump());
  }
  expect_no_leak(spec.port());
  EXPECT_EQ(spec.stop(), 0) << spec.log();
  EXPECT_EQ(plain.stop(), 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ServeSpec,
                         ::testing::Values(SpecCase{"tiny", 1}, SpecCase{"tiny", 3}, SpecCase{"tiny", 5},
                                           SpecCase{"realdims", 3}, SpecCase{"realdims_fp8", 3}),
                         [](const auto& p) {
                           return std::string(p.param.model) + "_steps" + std::to_string(p.param.steps);
                         });

}  // namespace
}  // namespace dsaserve::testing
