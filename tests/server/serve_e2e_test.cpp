// End to end: the real `dsaserve serve` on the tiny fixture model (with the built-in byte tokenizer) on a
// free port. Greedy completions equal the fixture's goldens alone and inside a batch of 16 others; chat and
// completions, streamed and not; n > 1 with seeds; stop strings; usage with cached tokens; errors as
// OpenAI error objects; 64 concurrent streaming clients with /health answering and no leaked pages; a
// client that disconnects mid-stream frees its pages; SIGTERM exits 0.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <random>

#include "io/safetensors.h"
#include "model/golden_util.h"      // tests/model/: ids_of
#include "server/server_process.h"  // tests/server/

namespace dsaserve::testing {
namespace {

using nlohmann::json;

// Every Serve test runs against two servers: overlap scheduling on (the default) and off
// (--disable-overlap-schedule); each is started by the first test that needs it.
class Serve : public ::testing::TestWithParam<bool> {
 protected:
  static void TearDownTestSuite() {
    for (ServerProcess*& s : servers_) {
      if (s) {
        EXPECT_EQ(s->stop(), 0) << "SIGTERM should exit 0";
      }
      delete s;
      s = nullptr;
    }
  }
  void SetUp() override {
    DSA_FIXTURE_PATH(dir, "models/tiny");
    ServerProcess*& server = servers_[GetParam() ? 1 : 0];
    if (server == nullptr) {
      std::vector<std::string> args = {"--model",
                                       dir.string(),
                                       "--tokenizer",
                                       "builtin:bytes",
                                       "--kv-pages",
                                       "256",
                                       "--page-size",
                                       "16",
                                       "--max-running-requests",
                                       "32",
                                       "--chunked-prefill-size",
                                       "64",
                                       "--check-integrity",
                                       "--served-model-name",
                                       "tiny"};
      if (!GetParam()) args.push_back("--disable-overlap-schedule");
      server = new ServerProcess(args);
    }
    ASSERT_GT(server->port(), 0) << "server did not start:\n" << server->log();
    port_ = server->port();
    tiny_ = dir;
  }
  // Pages held by requests (used minus prefix cache) once the server is idle.
  void expect_no_leak() {
    for (int i = 0; i < 100; ++i) {
      const std::string m = http_request(port_, "GET", "/metrics").body;
      if (metric(m, "dsaserve_num_running_requests") == 0 &&
          metric(m, "dsaserve_num_waiting_requests") == 0 &&
          metric(m, "dsaserve_kv_pages_used") == metric(m, "dsaserve_prefix_cache_pages")) {
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const std::string m = http_request(port_, "GET", "/metrics").body;
    ADD_FAILURE() << "pages not released: used " << metric(m, "dsaserve_kv_pages_used") << ", prefix cache "
                  << metric(m, "dsaserve_prefix_cache_pages") << ", running "
                  << metric(m, "dsaserve_num_running_requests");
  }
  static inline ServerProcess* servers_[2] = {nullptr, nullptr};  // [overlap off, on]
  int port_ = 0;
  std::filesystem::path tiny_;
};

json greedy_body(const std::vector<int32_t>& prompt, size_t n) {
  return {{"model", "tiny"},  {"prompt", prompt},   {"max_tokens", n},
          {"temperature", 0}, {"ignore_eos", true}, {"return_token_ids", true}};
}

TEST_P(Serve, GreedyCompletionsEqualGoldensAloneAndInABatch) {
  auto gold = io::SafetensorsFile::open(tiny_ / "goldens.safetensors");
  std::vector<std::vector<int32_t>> prompts, expect;
  for (int j = 0; j < 2; ++j) {
    prompts.push_back(ids_of(gold->get(fmt::format("greedy{}.prompt", j))));
    expect.push_back(ids_of(gold->get(fmt::format("greedy{}.output", j))));
  }
  for (size_t j = 0; j < prompts.size(); ++j) {
    const HttpResult r = post_json(port_, "/v1/completions", greedy_body(prompts[j], expect[j].size()));
    ASSERT_EQ(r.status, 200) << r.body;
    const json body = r.json();
    EXPECT_EQ(body["choices"][0]["token_ids"].get<std::vector<int32_t>>(), expect[j]) << "greedy" << j;
    EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(body["usage"]["completion_tokens"], expect[j].size());
    EXPECT_EQ(body["usage"]["prompt_tokens"], prompts[j].size());
  }
  // The same requests among 16 concurrent others of random lengths.
  std::vector<std::thread> threads;
  std::vector<HttpResult> results(18);
  std::mt19937 rng(5);
  for (int i = 0; i < 16; ++i) {
    std::vector<int32_t> p;
    for (uint32_t k = 0, n = 1 + rng() % 50; k < n; ++k) p.push_back(int32_t(rng() % 512));
    const json b = greedy_body(p, 4 + rng() % 12);
    threads.emplace_back([&, i, b] { results[size_t(i)] = post_json(port_, "/v1/completions", b); });
  }
  for (size_t j = 0; j < 2; ++j) {
    threads.emplace_back([&, j] {
      results[16 + j] = post_json(port_, "/v1/completions", greedy_body(prompts[j], expect[j].size()));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 16; ++i) EXPECT_EQ(results[size_t(i)].status, 200) << results[size_t(i)].body;
  for (size_t j = 0; j < 2; ++j) {
    ASSERT_EQ(results[16 + j].status, 200);
    EXPECT_EQ(results[16 + j].json()["choices"][0]["token_ids"].get<std::vector<int32_t>>(), expect[j])
        << "greedy" << j << " in a batch";
  }
  expect_no_leak();
}

// The server's greedy and seeded sampled tokens equal `dsaserve generate` (one request, no batching).
TEST_P(Serve, TokensEqualDsaserveGenerate) {
  std::mt19937 rng(9);
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> p;
    for (uint32_t k = 0, n = 2 + rng() % 30; k < n; ++k) p.push_back(int32_t(rng() % 512));
    std::string ids;
    for (int32_t t : p) {
      if (!ids.empty()) ids += ',';
      ids += std::to_string(t);
    }
    for (const bool sampled : {false, true}) {
      const std::string flags = sampled ? " --temperature 0.8 --top-k 50 --seed 77" : "";
      std::string out;
      ASSERT_EQ(run_command(fmt::format("{} generate --model {} --prompt-ids {} --max-new-tokens 10{}",
                                        dsaserve_binary().string(), tiny_.string(), ids, flags),
                            &out),
                0)
          << out;
      const json gen = json::parse(out.substr(out.find('{')));
      json req = greedy_body(p, 10);
      if (sampled) {
        req["temperature"] = 0.8;
        req["top_k"] = 50;
        req["seed"] = 77;
      }
      const json r = post_json(port_, "/v1/completions", req).json();
      EXPECT_EQ(r["choices"][0]["token_ids"], gen["output_ids"])
          << (sampled ? "sampled" : "greedy") << " prompt " << i;
    }
  }
}

TEST_P(Serve, ChatStreamingAndNotAgree) {
  const json msgs =
      json::array({{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hello"}}});
  const json req = {{"messages", msgs}, {"max_tokens", 10}, {"temperature", 0}, {"ignore_eos", true}};
  const HttpResult r = post_json(port_, "/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  const json b = r.json();
  EXPECT_EQ(b["object"], "chat.completion");
  EXPECT_EQ(b["model"], "tiny");
  EXPECT_EQ(b["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(b["usage"]["completion_tokens"], 10);
  EXPECT_EQ(b["usage"]["total_tokens"], b["usage"]["prompt_tokens"].get<int>() + 10);
  EXPECT_TRUE(b["usage"]["prompt_tokens_details"].contains("cached_tokens"));

  json sreq = req;
  sreq["stream"] = true;
  sreq["stream_options"] = {{"include_usage", true}};
  const HttpResult s = post_json(port_, "/v1/chat/completions", sreq);
  ASSERT_EQ(s.status, 200);
  bool done = false;
  const auto events = sse_events(s.body, &done);
  EXPECT_TRUE(done) << "no data: [DONE]";
  ASSERT_GE(events.size(), 2u);
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json& ch = events[i]["choices"][0];
    EXPECT_EQ(events[i]["object"], "chat.completion.chunk");
    if (i == 0) {
      EXPECT_EQ(ch["delta"]["role"], "assistant");
    }
    text += ch["delta"].value("content", "");
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(text, b["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(finish, "length");
  EXPECT_TRUE(events.back()["choices"].empty());
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 10);
}

TEST_P(Serve, SeededSamplingNChoicesAndLogprobs) {
  const json req = {
      {"prompt", "the cat"}, {"max_tokens", 8},          {"temperature", 1.0}, {"seed", 123}, {"n", 2},
      {"ignore_eos", true},  {"return_token_ids", true}, {"logprobs", 2}};
  const json a = post_json(port_, "/v1/completions", req).json();
  const json b = post_json(port_, "/v1/completions", req).json();
  ASSERT_EQ(a["choices"].size(), 2u) << a.dump();
  EXPECT_EQ(a["choices"][0]["token_ids"], b["choices"][0]["token_ids"]) << "same seed, same tokens";
  EXPECT_EQ(a["choices"][1]["token_ids"], b["choices"][1]["token_ids"]);
  EXPECT_NE(a["choices"][0]["token_ids"], a["choices"][1]["token_ids"]) << "n=2 choices should differ";
  EXPECT_EQ(a["usage"]["completion_tokens"], 16);
  const json& lp = a["choices"][0]["logprobs"];
  ASSERT_EQ(lp["token_logprobs"].size(), 8u);
  // The two most likely tokens, and the sampled one when it is not among them (vLLM, OpenAI: up to k + 1).
  EXPECT_GE(lp["top_logprobs"][0].size(), 2u);
  EXPECT_LE(lp["top_logprobs"][0].size(), 3u);
  for (const json& x : lp["token_logprobs"]) EXPECT_LE(x.get<double>(), 0.0);

  const json chat = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
                     {"max_tokens", 3},
                     {"logprobs", true},
                     {"top_logprobs", 3},
                     {"temperature", 0},
                     {"ignore_eos", true}};
  const json c = post_json(port_, "/v1/chat/completions", chat).json();
  ASSERT_EQ(c["choices"][0]["logprobs"]["content"].size(), 3u) << c.dump();
  EXPECT_EQ(c["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 3u);
}

TEST_P(Serve, StopStringsEndTheTextBeforeTheMatch) {
  const json base = {
      {"prompt", "once upon a time"}, {"max_tokens", 40}, {"temperature", 0}, {"ignore_eos", true}};
  const std::string full = post_json(port_, "/v1/completions", base).json()["choices"][0]["text"];
  ASSERT_GE(full.size(), 12u);
  // A stop string from the middle of the greedy text (ASCII letters only, so it is whole characters).
  std::string stop;
  for (size_t i = 4; i + 2 < full.size() && stop.empty(); ++i) {
    if (std::isalpha(uint8_t(full[i])) && std::isalpha(uint8_t(full[i + 1]))) stop = full.substr(i, 2);
  }
  ASSERT_FALSE(stop.empty()) << full;
  const std::string want = full.substr(0, full.find(stop));
  json req = base;
  req["stop"] = json::array({stop, "this-never-appears"});
  const json r = post_json(port_, "/v1/completions", req).json();
  EXPECT_EQ(r["choices"][0]["text"], want);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  req["stream"] = true;
  const auto events = sse_events(post_json(port_, "/v1/completions", req).body);
  std::string streamed;
  for (const json& e : events) streamed += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(streamed, want) << "held-back text must not leak the stop string";
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "stop");
  expect_no_leak();
}

TEST_P(Serve, SharedPrefixReportsCachedTokens) {
  std::vector<int32_t> prefix;
  for (int i = 0; i < 100; ++i) prefix.push_back((i * 29 + 7) % 500);
  post_json(port_, "/v1/completions", greedy_body(prefix, 2));
  std::vector<int32_t> second = prefix;
  for (int i = 0; i < 5; ++i) second.push_back(i + 3);
  const json r = post_json(port_, "/v1/completions", greedy_body(second, 2)).json();
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 96) << r.dump();  // 6 pages of 16
  const std::string m = http_request(port_, "GET", "/metrics").body;
  EXPECT_GE(metric(m, "dsaserve_prefix_cache_hit_tokens_total"), 96);
}

TEST_P(Serve, BadRequestsGetOpenAIErrors) {
  auto expect_error = [&](const std::string& target, const std::string& body, int status,
                          const std::string& param) {
    const HttpResult r = http_request(port_, "POST", target, body);
    EXPECT_EQ(r.status, status) << body << " -> " << r.body;
    const json j = r.json();
    ASSERT_TRUE(j.contains("error")) << r.body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    if (!param.empty()) {
      EXPECT_EQ(j["error"]["param"], param) << r.body;
    }
  };
  expect_error("/v1/completions", "{not json", 400, "");
  // Deep nesting is refused while parsing (later stages walk values recursively).
  expect_error("/v1/completions",
               R"({"prompt": "x", "stop": )" + std::string(100000, '[') + std::string(100000, ']') + "}", 400,
               "");
  expect_error("/v1/completions", R"({"prompt": "x", "temperature": "hot"})", 400, "temperature");
  expect_error("/v1/completions", R"({"prompt": "x", "max_tokens": -1})", 400, "max_tokens");
  expect_error("/v1/completions", R"({"prompt": [1, 99999]})", 400, "prompt");
  expect_error("/v1/completions", R"({"prompt": "x", "logit_bias": {"abc": 1}})", 400, "logit_bias");
  expect_error("/v1/completions", R"({"prompt": "x", "n": 0})", 400, "n");
  expect_error("/v1/completions", R"({"prompt": "x", "model": "gpt-9"})", 404, "model");
  expect_error("/v1/chat/completions", R"({"model": "tiny"})", 400, "messages");
  expect_error("/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})", 400,
               "messages[0].role");
  expect_error("/v1/chat/completions", R"({"messages": [{"role": "user", "content": 5}]})", 400,
               "messages[0].content");
  expect_error("/v1/chat/completions", R"({"messages": [{"role": "user"}]})", 400, "messages[0].content");
  expect_error("/v1/chat/completions",
               R"({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]})", 400,
               "messages[1].tool_call_id");
  expect_error("/v1/chat/completions",
               R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
                   "function": {"name": "f", "parameters": "{}"}}]})",
               400, "tools[0].function.parameters");
  std::vector<int32_t> huge(5000, 7);  // context 4096
  expect_error("/v1/completions", json{{"prompt", huge}}.dump(), 400, "prompt");
  expect_error("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 5000}}.dump(), 400, "max_tokens");
  EXPECT_EQ(http_request(port_, "GET", "/v1/nothing").status, 404);
  EXPECT_EQ(http_request(port_, "GET", "/v1/completions").status, 405);
  // The server is still fine.
  EXPECT_EQ(http_request(port_, "GET", "/health").status, 200);
  const json models = http_request(port_, "GET", "/v1/models").json();
  EXPECT_EQ(models["data"][0]["id"], "tiny");
}

TEST_P(Serve, DisconnectMidStreamFreesPages) {
  namespace net = boost::asio;
  net::io_context ioc;
  net::ip::tcp::socket sock(ioc);
  sock.connect({net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)});
  const std::string body =
      json{{"prompt", "abc"}, {"max_tokens", 3000}, {"ignore_eos", true}, {"stream", true}}.dump();
  const std::string req = fmt::format(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
      "{}\r\n\r\n{}",
      body.size(), body);
  net::write(sock, net::buffer(req));
  std::string got;
  char buf[1024];
  while (got.find("data: ") == std::string::npos) {
    const size_t n = sock.read_some(net::buffer(buf));
    got.append(buf, n);
  }
  const std::string m = http_request(port_, "GET", "/metrics").body;
  EXPECT_EQ(metric(m, "dsaserve_num_running_requests"), 1);
  sock.close();
  expect_no_leak();
}

TEST_P(Serve, ManyConcurrentStreamsCompleteWithHealthAnswering) {
  std::atomic<int> ok{0};
  std::atomic<bool> running{true};
  std::vector<std::thread> clients;
  for (int i = 0; i < 64; ++i) {
    clients.emplace_back([&, i] {
      std::mt19937 rng(uint32_t(100 + i));
      std::string prompt;
      for (uint32_t k = 0, n = 1 + rng() % 60; k < n; ++k) prompt.push_back(char('a' + rng() % 26));
      const json req = {{"prompt", prompt},
                        {"max_tokens", 1 + rng() % 24},
                        {"stream", true},
                        {"ignore_eos", true},
                        {"stream_options", {{"include_usage", true}}}};
      const HttpResult r = post_json(port_, "/v1/completions", req);
      bool done = false;
      const auto ev = sse_events(r.body, &done);
      if (r.status == 200 && done && !ev.empty() &&
          ev.back()["usage"]["completion_tokens"] == req["max_tokens"])
        ++ok;
    });
  }
  int health_ok = 0, health_total = 0;
  std::thread health([&] {
    while (running) {
      ++health_total;
      health_ok += http_request(port_, "GET", "/health").status == 200 ? 1 : 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  for (auto& c : clients) c.join();
  running = false;
  health.join();
  EXPECT_EQ(ok, 64);
  EXPECT_GT(health_total, 0);
  EXPECT_EQ(health_ok, health_total);
  expect_no_leak();
}

INSTANTIATE_TEST_SUITE_P(Overlap, Serve, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "on" : "off"; });

// --load-format dummy from a config file alone (no checkpoint, no tokenizer beside it: builtin:bytes), with
// --json-model-override-args: the server starts, says where its weights came from and answers chat and
// completions.
TEST(ServeDummy, ConfigFileWithDummyWeightsAnswers) {
  DSA_FIXTURE_PATH(tiny, "models/tiny/config.json");
  ServerProcess s({"--model", tiny.string(), "--load-format", "dummy", "--json-model-override-args",
                   R"({"num_hidden_layers": 2})", "--kv-pages", "16"});
  ASSERT_GT(s.port(), 0) << s.log();
  EXPECT_NE(s.log().find("--tokenizer builtin:bytes"), std::string::npos) << s.log();
  // ignore_eos: the request samples (temperature 1, no seed), and random weights may pick the end token
  // early.
  const HttpResult c =
      post_json(s.port(), "/v1/completions", {{"prompt", "hi"}, {"max_tokens", 3}, {"ignore_eos", true}});
  EXPECT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.json()["usage"]["completion_tokens"], 3) << c.body;
  const HttpResult ch = post_json(s.port(), "/v1/chat/completions",
                                  {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}});
  EXPECT_EQ(ch.status, 200) << ch.body;
  EXPECT_EQ(s.stop(), 0);
}

TEST(ServeAuth, ApiKeyIsRequiredOnV1) {  // the built-in model: no fixtures needed
  ServerProcess s({"--model", "builtin:demo", "--api-key", "sekrit", "--kv-pages", "16"});
  ASSERT_GT(s.port(), 0) << s.log();
  const json req = {{"prompt", "hi"}, {"max_tokens", 2}};
  const HttpResult no = post_json(s.port(), "/v1/completions", req);
  EXPECT_EQ(no.status, 401);
  EXPECT_EQ(no.json()["error"]["code"], "invalid_api_key");
  EXPECT_EQ(post_json(s.port(), "/v1/completions", req, "wrong").status, 401);
  const HttpResult yes = post_json(s.port(), "/v1/completions", req, "sekrit");
  EXPECT_EQ(yes.status, 200) << yes.body;
  EXPECT_EQ(yes.json()["model"], "builtin:demo");
  EXPECT_EQ(http_request(s.port(), "GET", "/health").status, 200);  // no key needed
  EXPECT_EQ(s.stop(), 0);
}

// Priority scheduling: the field is validated; mixed priorities queued behind one running slot all
// complete with the scheduler's invariants (queue orders included) checked every step.
TEST(ServePriority, FieldIsValidatedAndMixedPrioritiesComplete) {
  ServerProcess s({"--model", "builtin", "--kv-pages", "32", "--max-running-requests", "1",
                   "--enable-priority-scheduling", "--check-integrity"});
  ASSERT_GT(s.port(), 0) << s.log();
  for (const json& bad : {json("high"), json(2.5), json(false)}) {
    const HttpResult r = post_json(s.port(), "/v1/completions", {{"prompt", "x"}, {"priority", bad}});
    EXPECT_EQ(r.status, 400) << bad.dump();
    EXPECT_EQ(r.json()["error"]["param"], "priority") << r.body;
  }
  std::vector<std::thread> clients;
  std::vector<HttpResult> results(6);
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&, i] {
      const json req = {{"prompt", "abc"},
                        {"max_tokens", 6},
                        {"ignore_eos", true},  // sampled at temperature 1: EOS may come early
                        {"priority", (i * 7) % 5 - 2}};
      results[size_t(i)] = post_json(s.port(), "/v1/completions", req);
    });
  }
  for (std::thread& t : clients) t.join();
  for (const HttpResult& r : results) {
    EXPECT_EQ(r.status, 200) << r.body << "\n" << s.log();
    if (r.status == 200) {
      EXPECT_EQ(r.json()["usage"]["completion_tokens"], 6) << r.body;
    }
  }
  EXPECT_EQ(s.stop(), 0);
}

TEST(ServeLimits, OverloadIs503AndLargeBodiesAre413) {
  ServerProcess s({"--model", "builtin", "--kv-pages", "16", "--max-running-requests", "1",
                   "--max-queued-requests", "0", "--max-body-bytes", "2000"});
  ASSERT_GT(s.port(), 0) << s.log();
  namespace net = boost::asio;
  net::io_context ioc;
  net::ip::tcp::socket sock(ioc);
  sock.connect({net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(s.port())});
  const std::string body =
      json{{"prompt", "abc"}, {"max_tokens", 900}, {"ignore_eos", true}, {"stream", true}}.dump();
  net::write(sock, net::buffer(
                       fmt::format("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{}",
                                   body.size(), body)));
  std::string got;
  char buf[1024];
  while (got.find("data: ") == std::string::npos) got.append(buf, sock.read_some(net::buffer(buf)));
  const HttpResult busy = post_json(s.port(), "/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}});
  EXPECT_EQ(busy.status, 503) << busy.body;
  EXPECT_EQ(busy.json()["error"]["type"], "server_error");
  const HttpResult big = http_request(s.port(), "POST", "/v1/completions", std::string(5000, ' '));
  EXPECT_EQ(big.status, 413) << big.body;
  sock.close();
  // Once the first request is gone (its client disconnected), the server takes new ones.
  HttpResult after;
  for (int i = 0; i < 100; ++i) {
    after = post_json(s.port(), "/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}});
    if (after.status == 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(s.stop(), 0);
}

TEST(ServeShutdown, SigtermFinishesInFlightRequestsAndExitsZero) {
  ServerProcess s({"--model", "builtin", "--kv-pages", "16"});
  ASSERT_GT(s.port(), 0) << s.log();
  HttpResult r;
  std::thread client([&] {
    r = post_json(s.port(), "/v1/completions", {{"prompt", "hi"}, {"max_tokens", 150}, {"ignore_eos", true}});
  });
  // Wait until the request is running, then SIGTERM.
  for (int i = 0; i < 200; ++i) {
    const std::string m = http_request(s.port(), "GET", "/metrics").body;
    if (metric(m, "dsaserve_num_running_requests") == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(s.stop(), 0);
  client.join();
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["usage"]["completion_tokens"], 150);
}

}  // namespace
}  // namespace dsaserve::testing
