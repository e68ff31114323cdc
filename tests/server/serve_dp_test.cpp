// End to end: `dsaserve serve --tp N --attn-dp-size D` (the real binary: rank 0 is the HTTP front and
// the DP controller, each DP group's leader runs its own engine, the ranks are processes over Gloo) on
// the tiny fixture model. Greedy completions equal `--tp 1`'s, each alone and 8 at once spread over the
// DP groups (/metrics per DP rank says where they ran); no KV page leaks on any group, a disconnected
// client's request included; SIGTERM ends every rank with status 0; a killed DP leader that is not rank 0
// ends the server with an error in bounded time.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <fstream>
#include <random>

#include "io/safetensors.h"
#include "model/golden_util.h"        // tests/model/: ids_of
#include "server/serve_ranks_util.h"  // tests/server/
#include "server/server_process.h"    // tests/server/

namespace dsaserve::testing {
namespace {

using nlohmann::json;
using namespace serve_ranks;

// post_json, a failed connection (the server gone) as status 0 with the reason as the body.
HttpResult post(int port, const std::string& target, const json& body) {
  try {
    return post_json(port, target, body);
  } catch (const std::exception& e) {
    return {0, e.what()};
  }
}

double dp_metric(const std::string& m, const char* name, int dp) {
  return metric(m, fmt::format("{}{{dp_rank=\"{}\"}}", name, dp));
}

// Every DP group's pages are back (only the prefix cache holds any), within a few seconds.
void expect_no_leak(int port, int dp, const std::string& what) {
  std::string m;
  for (int i = 0; i < 100; ++i) {
    m = http_request(port, "GET", "/metrics").body;
    bool ok = metric(m, "dsaserve_kv_pages_used") == metric(m, "dsaserve_prefix_cache_pages");
    for (int d = 0; d < dp; ++d)
      ok =
          ok &&
          dp_metric(m, "dsaserve_dp_kv_pages_used", d) == dp_metric(m, "dsaserve_dp_prefix_cache_pages", d) &&
          dp_metric(m, "dsaserve_dp_num_running_requests", d) == 0;
    if (ok) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ADD_FAILURE() << what << ": KV pages leaked\n" << m;
}

// A streaming request whose client goes away after its first bytes.
void disconnect_midway(int port, const std::vector<int32_t>& prompt) {
  json b = greedy_body(prompt, 3000);
  b["stream"] = true;
  const std::string body = b.dump();
  const std::string raw = fmt::format(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
      "{}\r\n\r\n{}",
      body.size(), body);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::send(fd, raw.data(), raw.size(), MSG_NOSIGNAL), ssize_t(raw.size()));
  std::string got;
  char buf[4096];
  while (got.find("data: ") == std::string::npos) {  // the first token came: the request is running
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, size_t(n));
  }
  ::close(fd);
  EXPECT_NE(got.find("data: "), std::string::npos) << got;
}

class ServeDp : public ::testing::Test {
 protected:
  void SetUp() override {
    DSA_FIXTURE_PATH(dir, "models/tiny");
    tiny_ = dir;
  }
  std::filesystem::path tiny_;
};

TEST_F(ServeDp, GreedyCompletionsEqualOneRankAloneAndEightAtOnceOverTheDpGroups) {
  const Requests q = make_requests(tiny_);
  std::vector<std::vector<int32_t>> want;
  {
    ServerProcess one(server_args(tiny_, {}));
    ASSERT_GT(one.port(), 0) << one.log();
    for (size_t i = 0; i < q.prompts.size(); ++i)
      want.push_back(
          token_ids(post(one.port(), "/v1/completions", greedy_body(q.prompts[i], q.new_tokens[i]))));
    EXPECT_EQ(one.stop(), 0);
  }
  for (size_t j = 0; j < q.golden.size(); ++j) ASSERT_EQ(want[j], q.golden[j]) << "--tp 1 greedy" << j;
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--tp", "2", "--attn-dp-size", "2"},
        std::vector<std::string>{"--tp", "2", "--ep-size", "2", "--attn-dp-size", "2",
                                 "--load-balance-method", "shortest_queue"},
        std::vector<std::string>{"--tp", "4", "--attn-dp-size", "2", "--dsa-topk-broadcast"},
        std::vector<std::string>{"--tp", "2", "--ep-size", "2", "--attn-dp-size", "2", "--moe-a2a-backend",
                                 "deepep"}}) {
    const std::string name = fmt::format("{}", fmt::join(layout, " "));
    ServerProcess s(server_args(tiny_, layout), 0, true);
    ASSERT_GT(s.port(), 0) << s.log();
    const std::map<int, pid_t> ranks = ranks_of(s.pid());
    EXPECT_EQ(ranks.size(), size_t(std::stoi(layout[1]))) << name;
    for (size_t i = 0; i < q.prompts.size(); ++i) {
      EXPECT_EQ(token_ids(post(s.port(), "/v1/completions", greedy_body(q.prompts[i], q.new_tokens[i]))),
                want[i])
          << name << " request " << i << " alone\n"
          << s.output();
    }
    std::vector<json> bodies;
    for (size_t i = 0; i < q.prompts.size(); ++i)
      bodies.push_back(greedy_body(q.prompts[i], q.new_tokens[i]));
    const std::vector<HttpResult> got = post_json_at_once(s.port(), "/v1/completions", bodies);
    int equal = 0;
    for (size_t i = 0; i < q.prompts.size(); ++i) {
      EXPECT_EQ(token_ids(got[i]), want[i]) << name << " request " << i << " of 8 at once\n" << s.output();
      equal += token_ids(got[i]) == want[i] ? 1 : 0;
    }
    // Both DP groups ran requests (round robin: every other one; shortest queue: whichever had fewer).
    const std::string m = http_request(s.port(), "GET", "/metrics").body;
    const double gen0 = dp_metric(m, "dsaserve_dp_engine_generated_tokens_total", 0),
                 gen1 = dp_metric(m, "dsaserve_dp_engine_generated_tokens_total", 1);
    EXPECT_GT(gen0, 0) << name << "\n" << m;
    EXPECT_GT(gen1, 0) << name << "\n" << m;
    EXPECT_EQ(metric(m, "dsaserve_engine_generated_tokens_total"), gen0 + gen1) << name;
    std::printf(
        "RESULT serve %s: %d of 8 concurrent greedy completions equal --tp 1 (tokens by DP group: %.0f, "
        "%.0f)\n",
        name.c_str(), equal, gen0, gen1);
    expect_no_leak(s.port(), 2, name);
    // A client that goes away mid-stream, on each DP group (round robin / the emptier queue): its pages
    // come back on the group that owned it.
    disconnect_midway(s.port(), q.prompts[2]);
    disconnect_midway(s.port(), q.prompts[3]);
    expect_no_leak(s.port(), 2, name + " after two disconnects");
    const std::string m2 = http_request(s.port(), "GET", "/metrics").body;
    EXPECT_GE(metric(m2, "dsaserve_aborted_requests_total{endpoint=\"/v1/completions\"}"), 2) << m2;
    EXPECT_EQ(s.stop(), 0) << name << ": SIGTERM should end every rank with status 0\n" << s.output();
    for (const auto& [r, pid] : ranks)
      EXPECT_FALSE(alive(pid)) << name << ": rank " << r << " outlived the server";
  }
}

// A grammar-constrained request (its matcher lives in rank 0's process) runs on DP group 0, with the
// output of one rank; an unconstrained one next still goes round robin.
TEST_F(ServeDp, AConstrainedRequestRunsOnDpGroupZero) {
  const json body = {{"model", "tiny"},
                     {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
                     {"max_tokens", 12},
                     {"temperature", 0},
                     {"response_format", {{"type", "json_object"}}}};
  std::string want;
  {
    ServerProcess one(server_args(tiny_, {}));
    ASSERT_GT(one.port(), 0) << one.log();
    const HttpResult r = post(one.port(), "/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    want = r.json()["choices"][0]["message"]["content"].get<std::string>();
    EXPECT_EQ(one.stop(), 0);
  }
  ASSERT_EQ(want.substr(0, 1), "{") << want;
  ServerProcess s(server_args(tiny_, {"--tp", "2", "--attn-dp-size", "2"}), 0, true);
  ASSERT_GT(s.port(), 0) << s.log();
  for (int i = 0; i < 3; ++i) {
    const HttpResult r = post(s.port(), "/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.json()["choices"][0]["message"]["content"].get<std::string>(), want) << i;
  }
  std::string m = http_request(s.port(), "GET", "/metrics").body;
  EXPECT_EQ(dp_metric(m, "dsaserve_dp_engine_generated_tokens_total", 1), 0) << m;
  EXPECT_EQ(token_ids(post(s.port(), "/v1/completions", greedy_body({1, 2, 3}, 4))).size(),
            4u);  // group 0
  EXPECT_EQ(token_ids(post(s.port(), "/v1/completions", greedy_body({1, 2, 3}, 4))).size(),
            4u);  // group 1
  m = http_request(s.port(), "GET", "/metrics").body;
  EXPECT_EQ(dp_metric(m, "dsaserve_dp_engine_generated_tokens_total", 1), 4) << m;
  EXPECT_EQ(s.stop(), 0) << s.output();
}

// Hostile bytes at the DP front (rank 0's HTTP server routes only what it validated): each is a 4xx with an
// OpenAI error body, no rank dies, and both DP groups still answer and hold no pages afterwards.
TEST_F(ServeDp, HostileRequestsAreRefusedAndTheGroupsStillServe) {
  ServerProcess s(server_args(tiny_, {"--tp", "2", "--attn-dp-size", "2"}), 0, true);
  ASSERT_GT(s.port(), 0) << s.log();
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"/v1/completions", "{not json"},
      {"/v1/completions", deep},
      {"/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"\xff\xfe\xc3\x28\",\"max_tokens\":4}"},
      {"/v1/completions", "{\"model\":\"tiny\",\"prompt\":[1,2,99999999],\"max_tokens\":4}"},
      {"/v1/completions", "{\"model\":\"tiny\",\"prompt\":[1,-5],\"max_tokens\":4}"},
      {"/v1/completions", "{\"model\":\"tiny\",\"prompt\":[1,2],\"max_tokens\":1e300}"},
      {"/v1/chat/completions",
       "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"\xc0\x80\"}]}"},
      {"/v1/chat/completions",
       "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":"
       "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"nonsense\"}}}}"}};
  for (size_t i = 0; i < bad.size(); ++i) {
    const HttpResult r = http_request(s.port(), "POST", bad[i].first, bad[i].second);
    EXPECT_GE(r.status, 400) << i << " " << r.body;
    EXPECT_LT(r.status, 500) << i << " " << r.body;
    const json e = r.json();
    EXPECT_TRUE(e.is_object() && e.contains("error") && e["error"].contains("message")) << i << " " << r.body;
  }
  for (int i = 0; i < 2; ++i)  // one on each DP group
    EXPECT_EQ(token_ids(post(s.port(), "/v1/completions", greedy_body({1, 2, 3}, 4))).size(), 4u) << i;
  expect_no_leak(s.port(), 2, "after hostile requests");
  EXPECT_EQ(s.stop(), 0) << s.output();
}

// Idle for longer than --dist-timeout: the DP leaders' rounds and the followers' beats keep every rank
// inside it.
TEST_F(ServeDp, AnIdleServerOutlivesTheDistTimeout) {
  ServerProcess s(server_args(tiny_, {"--tp", "4", "--attn-dp-size", "2", "--dist-timeout", "1"}), 0, true);
  ASSERT_GT(s.port(), 0) << s.log();
  std::this_thread::sleep_for(std::chrono::seconds(4));
  const Requests q = make_requests(tiny_);
  for (int i = 0; i < 2; ++i)  // one on each DP group
    EXPECT_EQ(token_ids(post(s.port(), "/v1/completions", greedy_body(q.prompts[i], q.new_tokens[i]))),
              q.golden[i])
        << s.output();
  EXPECT_EQ(s.stop(), 0) << s.output();
}

// A DP group's leader (rank 1 of tp 2 dp 2; rank 2 of tp 4 dp 2) killed: the server ends with an error
// well within the bound, and a request in flight on it ends.
TEST_F(ServeDp, AKilledDpLeaderEndsTheServerWithAnError) {
  for (const auto& [tp, victim] : {std::pair{2, 1}, std::pair{4, 2}}) {
    ServerProcess s(
        server_args(tiny_, {"--tp", std::to_string(tp), "--attn-dp-size", "2", "--dist-timeout", "30"}), 0,
        true);
    ASSERT_GT(s.port(), 0) << s.log();
    const std::map<int, pid_t> ranks = ranks_of(s.pid());
    ASSERT_EQ(ranks.size(), size_t(tp));
    std::atomic<bool> answered{false};
    std::thread client([&] {
      try {
        (void)post_json(s.port(), "/v1/completions", greedy_body({1, 2, 3}, 4));  // group 0
        json b = greedy_body({1, 2, 3}, 3000);                                    // group 1
        b["stream"] = true;
        (void)post_json(s.port(), "/v1/completions", b);
      } catch (const std::exception&) {  // the connection was closed: the point is that it ends
      }
      answered = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    const auto t0 = std::chrono::steady_clock::now();
    ::kill(ranks.at(victim), SIGKILL);
    const std::optional<int> status = s.wait_exit(std::chrono::seconds(20));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(status.has_value()) << "rank " << victim << " killed: the server did not end\n" << s.output();
    EXPECT_NE(*status, 0) << s.output();
    EXPECT_LT(secs, 10) << s.output();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const std::string out = s.output();
    EXPECT_NE(out.find(fmt::format("rank {} was killed by signal 9", victim)), std::string::npos) << out;
    for (const auto& [r, pid] : ranks) EXPECT_FALSE(alive(pid)) << "rank " << r << " outlived the server";
    client.join();
    EXPECT_TRUE(answered);
    std::printf(
        "RESULT serve --tp %d --attn-dp-size 2: rank %d killed -> server ended with status %d in %.2f s\n",
        tp, victim, *status, secs);
  }
}

// A DP leader that hangs (SIGSTOP) fails the front's next round after --dist-timeout: the server ends.
TEST_F(ServeDp, AHungDpLeaderEndsTheServerAfterTheDistTimeout) {
  ServerProcess s(server_args(tiny_, {"--tp", "2", "--attn-dp-size", "2", "--dist-timeout", "2"}), 0, true);
  ASSERT_GT(s.port(), 0) << s.log();
  const std::map<int, pid_t> ranks = ranks_of(s.pid());
  ASSERT_EQ(ranks.size(), 2u);
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(ranks.at(1), SIGSTOP);
  const std::optional<int> status = s.wait_exit(std::chrono::seconds(30));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::kill(ranks.at(1), SIGCONT);
  ASSERT_TRUE(status.has_value()) << "a hung DP leader: the server did not end\n" << s.output();
  EXPECT_NE(*status, 0) << s.output();
  EXPECT_LT(secs, 15) << s.output();  // 2 s timeout + 3 s grace
  EXPECT_NE(s.output().find("rank 0 exited with status 1"), std::string::npos) << s.output();
  std::printf("RESULT serve --tp 2 --attn-dp-size 2: rank 1 hung -> server ended with status %d in %.2f s\n",
              *status, secs);
}

// The flag's limits: speculative decoding and CUDA are refused with attention DP, naming the flag.
TEST_F(ServeDp, RefusedCombinationsSayWhy) {
  std::string out;
  EXPECT_NE(
      run_command(fmt::format("{} serve --model {} --tp 2 --attn-dp-size 2 --speculative-algorithm EAGLE "
                              "--speculative-num-steps 1 --speculative-eagle-topk 1 "
                              "--speculative-num-draft-tokens 2 2>&1",
                              dsaserve_binary().string(), tiny_.string()),
                  &out),
      0);
  EXPECT_NE(out.find("--speculative-algorithm with --tp 2"), std::string::npos) << out;
  EXPECT_NE(run_command(fmt::format("{} serve --model {} --tp 2 --attn-dp-size 2 --device cuda 2>&1",
                                    dsaserve_binary().string(), tiny_.string()),
                        &out),
            0);
  EXPECT_NE(out.find("--attn-dp-size 2 is not run yet"), std::string::npos) << out;
  EXPECT_NE(
      run_command(fmt::format("{} serve --model {} --tp 2 --attn-dp-size 2 --load-balance-method nope 2>&1",
                              dsaserve_binary().string(), tiny_.string()),
                  &out),
      0);
  EXPECT_NE(out.find("--load-balance-method"), std::string::npos) << out;
}

}  // namespace
}  // namespace dsaserve::testing
