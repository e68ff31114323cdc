// End to end: `dsaserve serve --tp N` (the real binary: rank 0 is the HTTP front and leads ranks that are
// processes talking over Gloo) on the tiny fixture model. Greedy completions equal those of `--tp 1` and
// the goldens, each alone and 8 at once (chunked prefills, prompts past the indexer's top-k); an idle
// server outlives --dist-timeout (the idle beats); SIGTERM ends every rank with status 0; a follower or
// rank 0 killed, or a follower hung, ends the whole server with an error in bounded time, never a hang.
#include <dirent.h>
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <set>

#include "io/safetensors.h"
#include "model/golden_util.h"        // tests/model/: ids_of
#include "server/serve_ranks_util.h"  // tests/server/
#include "server/server_process.h"    // tests/server/

namespace dsaserve::testing {
namespace {

using nlohmann::json;
using namespace serve_ranks;

class ServeTp : public ::testing::Test {
 protected:
  void SetUp() override {
    DSA_FIXTURE_PATH(dir, "models/tiny");
    tiny_ = dir;
  }
  std::filesystem::path tiny_;
};

TEST_F(ServeTp, GreedyCompletionsEqualOneRankAloneAndEightAtOnce) {
  const Requests q = make_requests(tiny_);
  std::vector<std::vector<int32_t>> want;
  {
    ServerProcess one(server_args(tiny_, {}));
    ASSERT_GT(one.port(), 0) << one.log();
    for (size_t i = 0; i < q.prompts.size(); ++i)
      want.push_back(
          token_ids(post_json(one.port(), "/v1/completions", greedy_body(q.prompts[i], q.new_tokens[i]))));
    EXPECT_EQ(one.stop(), 0);
  }
  for (size_t j = 0; j < q.golden.size(); ++j) ASSERT_EQ(want[j], q.golden[j]) << "--tp 1 greedy" << j;
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--tp", "2"}, std::vector<std::string>{"--tp", "2", "--ep-size", "2"},
        std::vector<std::string>{"--tp", "4", "--ep-size", "2", "--dsa-topk-broadcast"},
        std::vector<std::string>{"--tp", "2", "--ep-size", "2", "--moe-a2a-backend", "deepep"}}) {
    const std::string name = fmt::format("{}", fmt::join(layout, " "));
    ServerProcess s(server_args(tiny_, layout));
    ASSERT_GT(s.port(), 0) << s.log();
    const std::map<int, pid_t> ranks = ranks_of(s.pid());
    EXPECT_EQ(ranks.size(), size_t(std::stoi(layout[1]))) << name;
    for (size_t i = 0; i < q.prompts.size(); ++i) {
      EXPECT_EQ(token_ids(post_json(s.port(), "/v1/completions", greedy_body(q.prompts[i], q.new_tokens[i]))),
                want[i])
          << name << " request " << i << " alone";
    }
    std::vector<json> bodies;
    for (size_t i = 0; i < q.prompts.size(); ++i)
      bodies.push_back(greedy_body(q.prompts[i], q.new_tokens[i]));
    const std::vector<HttpResult> got = post_json_at_once(s.port(), "/v1/completions", bodies);
    int equal = 0;
    for (size_t i = 0; i < q.prompts.size(); ++i) {
      EXPECT_EQ(token_ids(got[i]), want[i]) << name << " request " << i << " of 8 at once";
      equal += token_ids(got[i]) == want[i] ? 1 : 0;
    }
    std::printf("RESULT serve %s: %d of 8 concurrent greedy completions equal --tp 1\n", name.c_str(), equal);
    const std::string m = http_request(s.port(), "GET", "/metrics").body;
    EXPECT_EQ(metric(m, "dsaserve_kv_pages_used"), metric(m, "dsaserve_prefix_cache_pages")) << name;
    EXPECT_EQ(s.stop(), 0) << name << ": SIGTERM should end every rank with status 0\n" << s.output();
    for (const auto& [r, pid] : ranks)
      EXPECT_FALSE(alive(pid)) << name << ": rank " << r << " outlived the server";
  }
}

// Idle for longer than --dist-timeout: the followers wait on rank 0's beats, not on a silent socket.
TEST_F(ServeTp, AnIdleServerOutlivesTheDistTimeout) {
  ServerProcess s(server_args(tiny_, {"--tp", "2", "--dist-timeout", "1"}), 0, true);
  ASSERT_GT(s.port(), 0) << s.log();
  std::this_thread::sleep_for(std::chrono::seconds(4));
  const Requests q = make_requests(tiny_);
  EXPECT_EQ(token_ids(post_json(s.port(), "/v1/completions", greedy_body(q.prompts[0], q.new_tokens[0]))),
            q.golden[0])
      << s.output();
  EXPECT_EQ(s.stop(), 0) << s.output();
}

// A killed rank ends the server with an error in bounded time (serve_ranks_util.h).
TEST_F(ServeTp, AKilledRankEndsTheServerWithAnError) {
  for (const int victim : {1, 0}) expect_a_killed_rank_ends_the_server(tiny_, {"--tp", "2"}, victim);
}

// --trace-dir traces rank 0: its collectives (the model's and the step messages') beside the plan of the
// deployment that ran; rank 1 writes its own under rank1/ (serve_deepep_test reads both).
TEST_F(ServeTp, TraceDirRecordsRankZerosCollectivesBesideTheDeploymentsPlan) {
  const std::filesystem::path dir = ::testing::TempDir() + "serve_tp_trace";
  std::filesystem::remove_all(dir);
  ServerProcess s(server_args(tiny_, {"--tp", "2", "--ep-size", "2", "--trace-dir", dir.string()}));
  ASSERT_GT(s.port(), 0) << s.log();
  EXPECT_EQ(token_ids(post_json(s.port(), "/v1/completions", greedy_body({1, 2, 3}, 4))).size(), 4u);
  EXPECT_EQ(s.stop(), 0);
  std::filesystem::path file;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file()) file = e.path();  // rank 0's (the others' are under rank<r>/)
  ASSERT_FALSE(file.empty()) << "no trace in " << dir;
  EXPECT_TRUE(std::filesystem::exists(dir / "rank1") && !std::filesystem::is_empty(dir / "rank1"))
      << "rank 1 wrote no trace";
  std::ifstream f(file);
  const json ps = json::parse(f)["plan_summary"];
  EXPECT_EQ(ps["deployment"], "tp2,ep2,dp1") << ps.dump();
  std::set<std::string> names;
  for (const auto& c : ps["collectives"]["traced"]) names.insert(c["name"].get<std::string>());
  for (const char* n : {"attn_tp_all_reduce", "embed_all_reduce", "lm_head_all_gather", "step_broadcast"})
    EXPECT_TRUE(names.count(n)) << n << " not traced: " << ps["collectives"].dump();
}

// A follower that hangs (SIGSTOP) fails rank 0's next message after --dist-timeout: the server ends.
TEST_F(ServeTp, AHungFollowerEndsTheServerAfterTheDistTimeout) {
  ServerProcess s(server_args(tiny_, {"--tp", "2", "--dist-timeout", "2"}), 0, true);
  ASSERT_GT(s.port(), 0) << s.log();
  const std::map<int, pid_t> ranks = ranks_of(s.pid());
  ASSERT_EQ(ranks.size(), 2u);
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(ranks.at(1), SIGSTOP);
  const std::optional<int> status = s.wait_exit(std::chrono::seconds(30));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::kill(ranks.at(1), SIGCONT);
  ASSERT_TRUE(status.has_value()) << "a hung follower: the server did not end\n" << s.output();
  EXPECT_NE(*status, 0) << s.output();
  EXPECT_LT(secs, 15) << s.output();  // 2 s timeout + 3 s grace
  EXPECT_NE(s.output().find("rank 0 exited with status 1"), std::string::npos) << s.output();
  std::printf("RESULT serve --tp 2: rank 1 hung -> server ended with status %d in %.2f s\n", *status, secs);
}

}  // namespace
}  // namespace dsaserve::testing
