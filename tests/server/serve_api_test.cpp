// End to end through the real `dsaserve serve --model builtin:demo` (issue 19, items 5, 7, 8):
// /metrics keeps a bounded label set whatever paths clients send, escapes label values and counts aborted
// requests; /v1/completions echo works streamed and for token-id prompts, with the prompt's logprobs
// (the first token's null, the others equal to what the model gives for that prefix) and text offsets
// that count the echoed prompt; logprobs report raw bytes, completions top_logprobs come in rank order
// without collisions, and `logprobs: 0` gives the chosen token's logprob.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "server/server_process.h"  // tests/server/

namespace dsaserve::testing {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

class ServeApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Small prefill chunks: prompt logprobs come from several steps.
    server_ = new ServerProcess(
        {"--model", "builtin:demo", "--kv-pages", "64", "--chunked-prefill-size", "4", "--check-integrity"});
  }
  static void TearDownTestSuite() {
    if (server_ != nullptr) {
      EXPECT_EQ(server_->stop(), 0);
    }
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_GT(server_->port(), 0) << server_->log(); }
  int port() const { return server_->port(); }
  std::string metrics_text() const { return http_request(port(), "GET", "/metrics").body; }
  ojson completion(const json& req) const {
    const HttpResult r = post_json(port(), "/v1/completions", req);
    EXPECT_EQ(r.status, 200) << r.body;
    return ojson::parse(r.body);
  }
  static inline ServerProcess* server_ = nullptr;
};

// Sends raw bytes as one request and returns the response head's status (0 when none came back).
int raw_status(int port, const std::string& bytes) {
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::socket s(ioc);
  s.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
  boost::asio::write(s, boost::asio::buffer(bytes));
  std::string got;
  boost::system::error_code ec;
  char buf[4096];
  while (got.find("\r\n") == std::string::npos) {
    const size_t n = s.read_some(boost::asio::buffer(buf), ec);
    if (ec) break;
    got.append(buf, n);
  }
  return got.rfind("HTTP/1.1 ", 0) == 0 ? std::stoi(got.substr(9, 3)) : 0;
}

// Every line of a Prometheus text exposition: a comment, or NAME{LABELS} VALUE with label values in
// double quotes where only \\, \" and \n are escaped.
void expect_valid_exposition(const std::string& text) {
  static const std::regex sample(
      R"re([a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*"(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*")*\})? [-+0-9.eEinfNa]+)re");
  std::istringstream in(text);
  std::string line;
  int samples = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    EXPECT_TRUE(std::regex_match(line, sample)) << "bad exposition line: " << line;
    ++samples;
  }
  EXPECT_GT(samples, 20);
}

TEST_F(ServeApi, MetricsLabelsStayBoundedAndEscaped) {
  const std::string before = metrics_text();
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(http_request(port(), "GET", "/no/such/path/" + std::to_string(i)).status, 404);
  }
  // Quote and backslash in the target (Beast accepts them): they must not break the exposition.
  EXPECT_EQ(raw_status(port(), "GET /a\"b\\c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 404);
  EXPECT_EQ(http_request(port(), "GET", "/v1/models/some-model").status / 100, 4);
  const std::string after = metrics_text();
  expect_valid_exposition(after);
  // 200 distinct unknown paths add no label: one "unmatched" series counts them.
  const auto series = [](const std::string& t) {
    int n = 0;
    for (size_t at = t.find("\ndsaserve_requests_total{"); at != std::string::npos;
         at = t.find("\ndsaserve_requests_total{", at + 1))
      ++n;
    return n;
  };
  EXPECT_LE(series(after), series(before) + 3) << after;
  EXPECT_EQ(after.find("/no/such/path"), std::string::npos);
  EXPECT_GE(metric(after, "dsaserve_requests_total{endpoint=\"unmatched\",status=\"404\"}"), 201);
  EXPECT_LT(after.size(), before.size() + 1024);
}

TEST_F(ServeApi, AbortedRequestsAreCounted) {
  const std::string key = "dsaserve_aborted_requests_total{endpoint=\"/v1/chat/completions\"}";
  const double before = metric(metrics_text(), key);
  ASSERT_GE(before, 0);
  {
    // A stream the client closes after its first events.
    boost::asio::io_context ioc;
    boost::asio::ip::tcp::socket s(ioc);
    s.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port())});
    const std::string body = json{
        {"messages", {{{"role", "user"}, {"content", "hi"}}}},
        {"max_tokens", 500},
        {"ignore_eos", true},
        {"stream", true}}.dump();
    boost::asio::write(
        s, boost::asio::buffer("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\n\r\n" + body));
    std::string got;
    char buf[4096];
    while (got.find("data: ") == std::string::npos) got.append(buf, s.read_some(boost::asio::buffer(buf)));
  }  // closed
  double after = before;
  for (int i = 0; i < 100 && after == before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    after = metric(metrics_text(), key);
  }
  EXPECT_EQ(after, before + 1);
}

// The raw bytes an OpenAI "bytes:\xNN..." token spelling stands for.
std::string spelled_bytes(const std::string& token) {
  std::string out;
  for (size_t i = 6; i + 3 < token.size() + 1; i += 4)
    out += char(std::stoi(token.substr(i + 2, 2), nullptr, 16));
  return out;
}

TEST_F(ServeApi, LogprobsBytesAreTheTokensRawBytes) {
  int byte_tokens = 0;
  for (int seed = 0; seed < 4; ++seed) {
    const json req = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                      {"max_tokens", 16},
                      {"logprobs", true},
                      {"top_logprobs", 20},
                      {"temperature", 1.0},
                      {"seed", seed}};
    const HttpResult r = post_json(port(), "/v1/chat/completions", req);
    ASSERT_EQ(r.status, 200) << r.body;
    const json body = r.json();
    for (const json& e : body["choices"][0]["logprobs"]["content"]) {
      std::vector<json> entries = {e};
      for (const json& t : e["top_logprobs"]) entries.push_back(t);
      for (const json& t : entries) {
        const std::string tok = t["token"];
        std::string bytes;
        for (const json& b : t["bytes"]) bytes += char(b.get<int>());
        if (tok.rfind("bytes:\\x", 0) == 0) {
          ++byte_tokens;
          EXPECT_EQ(bytes, spelled_bytes(tok)) << t.dump();
        } else {
          EXPECT_EQ(bytes, tok) << t.dump();
        }
        EXPECT_NE(bytes, "\xef\xbf\xbd") << "U+FFFD instead of the raw byte: " << t.dump();
      }
    }
  }
  EXPECT_GT(byte_tokens, 0) << "no byte token among 64 x 21 entries";
}

TEST_F(ServeApi, CompletionTopLogprobsAreRankOrderedAndComplete) {
  for (int seed = 0; seed < 4; ++seed) {
    const ojson b = completion(
        {{"prompt", "hello"}, {"max_tokens", 12}, {"logprobs", 5}, {"temperature", 1.0}, {"seed", seed}});
    const ojson& lp = b["choices"][0]["logprobs"];
    ASSERT_EQ(lp["top_logprobs"].size(), lp["tokens"].size());
    for (size_t i = 0; i < lp["tokens"].size(); ++i) {
      const ojson& top = lp["top_logprobs"][i];
      // Five alternatives, plus the chosen token when it is not among them.
      EXPECT_GE(top.size(), 5u) << top.dump();
      EXPECT_LE(top.size(), 6u) << top.dump();
      std::vector<double> values;
      for (const auto& [k, v] : top.items()) values.push_back(v.get<double>());
      for (size_t k = 1; k < 5; ++k)
        EXPECT_GE(values[k - 1], values[k]) << "not in rank order: " << top.dump();
      ASSERT_TRUE(top.contains(lp["tokens"][i].get<std::string>())) << top.dump();
      EXPECT_EQ(top[lp["tokens"][i].get<std::string>()], lp["token_logprobs"][i]);
    }
  }
}

TEST_F(ServeApi, LogprobsZeroGivesTheChosenTokensLogprob) {
  const ojson b = completion({{"prompt", "hello"}, {"max_tokens", 6}, {"logprobs", 0}, {"temperature", 0}});
  const ojson& lp = b["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    ASSERT_TRUE(lp["token_logprobs"][i].is_number()) << lp.dump();
    const ojson& top = lp["top_logprobs"][i];
    ASSERT_EQ(top.size(), 1u) << lp.dump();
    EXPECT_EQ(top[lp["tokens"][i].get<std::string>()], lp["token_logprobs"][i]);
  }
}

TEST_F(ServeApi, EchoWithLogprobsHasThePromptsEntries) {
  const std::vector<int> ids = {72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100};
  const ojson b =
      completion({{"prompt", ids}, {"max_tokens", 3}, {"echo", true}, {"logprobs", 3}, {"temperature", 0}});
  const ojson& c = b["choices"][0];
  const ojson& lp = c["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids.size() + 3) << lp.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  // The echoed text is the prompt's own, and the offsets count it.
  std::string prompt_text;
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(lp["text_offset"][i], int64_t(prompt_text.size()));
    prompt_text += lp["tokens"][i].get<std::string>();
  }
  const std::string text = c["text"];
  ASSERT_EQ(text.rfind(prompt_text, 0), 0u) << text;
  EXPECT_FALSE(prompt_text.empty());
  EXPECT_EQ(lp["text_offset"][ids.size()], int64_t(prompt_text.size()));
  // Prompt token k's entry is what the model gives after the prefix ids[0..k): the greedy completion of
  // that prefix reports the same top alternatives.
  for (size_t k = 1; k < ids.size(); k += 3) {
    const std::vector<int> prefix(ids.begin(), ids.begin() + std::ptrdiff_t(k));
    const ojson p = completion({{"prompt", prefix}, {"max_tokens", 1}, {"logprobs", 3}, {"temperature", 0}});
    const ojson& want = p["choices"][0]["logprobs"]["top_logprobs"][0];
    const ojson& got = lp["top_logprobs"][k];
    ASSERT_TRUE(lp["token_logprobs"][k].is_number()) << lp.dump();
    size_t n = 0;
    for (const auto& [tok, v] : want.items()) {
      if (n++ == 3) break;  // the three alternatives (the chosen token comes with them)
      ASSERT_TRUE(got.contains(tok)) << "position " << k << ": " << got.dump() << " vs " << want.dump();
      EXPECT_NEAR(got[tok].get<double>(), v.get<double>(), 1e-4) << k;
    }
    // The prompt token itself, when it is among the alternatives, has the entry's logprob.
    const std::string actual = lp["tokens"][k];
    if (want.contains(actual)) {
      EXPECT_NEAR(lp["token_logprobs"][k].get<double>(), want[actual].get<double>(), 1e-4);
    }
  }
}

TEST_F(ServeApi, EchoLogprobsCoverAPromptTheRadixCacheHolds) {
  std::vector<int> ids;
  for (int i = 0; i < 150; ++i) ids.push_back(32 + (i * 7) % 90);
  completion({{"prompt", ids}, {"max_tokens", 1}});  // its first two pages go to the prefix cache
  const ojson b = completion({{"prompt", ids}, {"max_tokens", 2}, {"echo", true}, {"logprobs", 1}});
  const ojson& lp = b["choices"][0]["logprobs"];
  ASSERT_EQ(lp["token_logprobs"].size(), ids.size() + 2) << lp.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  for (size_t i = 1; i < ids.size() + 2; ++i) EXPECT_TRUE(lp["token_logprobs"][i].is_number()) << i;
  EXPECT_EQ(b["usage"]["prompt_tokens"], int64_t(ids.size()));
}

TEST_F(ServeApi, EchoStreamsThePromptFirstAndMatchesTheWholeAnswer) {
  for (const json& prompt : {json("The cat sat"), json({84, 104, 101, 32, 100, 111, 103})}) {
    json req = {{"prompt", prompt}, {"max_tokens", 5}, {"echo", true}, {"temperature", 0}};
    const ojson whole = completion(req);
    const std::string text = whole["choices"][0]["text"];
    req["stream"] = true;
    const HttpResult s = post_json(port(), "/v1/completions", req);
    ASSERT_EQ(s.status, 200) << s.body;
    bool done = false;
    const auto events = sse_events(s.body, &done);
    ASSERT_TRUE(done);
    ASSERT_FALSE(events.empty());
    std::string streamed;
    for (const json& e : events) {
      for (const json& ch : e["choices"]) streamed += ch["text"].get<std::string>();
    }
    EXPECT_EQ(streamed, text);
    const std::string first = events[0]["choices"][0]["text"];
    EXPECT_FALSE(first.empty());
    EXPECT_EQ(text.rfind(first, 0), 0u);
    if (prompt.is_string()) {
      EXPECT_EQ(first, prompt.get<std::string>());
    }
  }
}

TEST_F(ServeApi, EchoOfTokenIdsIsTheirText) {
  const std::vector<int> ids = {97, 98, 99, 32, 100};
  const ojson echo =
      completion({{"prompt", ids}, {"max_tokens", 4}, {"echo", true}, {"logprobs", 0}, {"temperature", 0}});
  const ojson plain = completion({{"prompt", ids}, {"max_tokens", 4}, {"temperature", 0}});
  const ojson& lp = echo["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids.size() + 4);
  std::string prompt_text;
  for (size_t i = 0; i < ids.size(); ++i) prompt_text += lp["tokens"][i].get<std::string>();
  EXPECT_FALSE(prompt_text.empty());
  EXPECT_EQ(echo["choices"][0]["text"].get<std::string>(),
            prompt_text + plain["choices"][0]["text"].get<std::string>());
}

}  // namespace
}  // namespace dsaserve::testing
