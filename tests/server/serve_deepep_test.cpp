// End to end: `dsaserve serve --tp N --ep-size N --moe-a2a-backend deepep` (the real binary, ranks as
// processes over Gloo) on the tiny fixture model, bf16 experts, so DeepEP sends the rows as held (f32):
// the greedy completions equal `--tp 1`'s in serve_tp_test / serve_dp_test's layouts; here the traced
// collectives of every rank's decode steps against the plan of the deployment that ran, with and without
// attention DP, and a rank killed while the ranks dispatch and combine.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <tuple>

#include "server/serve_ranks_util.h"  // tests/server/
#include "server/server_process.h"    // tests/server/

namespace dsaserve::testing {
namespace {

using nlohmann::json;
using namespace serve_ranks;

class ServeDeepep : public ::testing::Test {
 protected:
  void SetUp() override {
    DSA_FIXTURE_PATH(dir, "models/tiny");
    tiny_ = dir;
  }
  std::filesystem::path tiny_;
};

using Entry = std::tuple<std::string, int64_t, double, double>;  // group, size, count, bytes per decode step
using Entries = std::map<std::string, Entry>;                    // by collective name

struct Decode {
  Entries traced[2], planned;  // [rank]: the model's collectives (the step messages' groups left out)
  std::map<std::string, double> planned_meta, planned_scale;
  int64_t passes = 0;  // rank 0's decode passes (every rank runs as many: in lockstep)
};

json read_trace(const std::filesystem::path& dir) {
  std::filesystem::path file;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file()) file = e.path();
  EXPECT_FALSE(file.empty()) << "no trace in " << dir;
  if (file.empty()) return json::object();
  std::ifstream f(file);
  return json::parse(f)["plan_summary"];
}

// One greedy request of 5 tokens through `serve LAYOUT --trace-dir` on two ranks: each rank's decode steps
// as traced (rank 0's trace in the folder, rank 1's under rank1/), and the plan's (rank 0's summary).
Decode decode_collectives(const std::filesystem::path& tiny, const std::vector<std::string>& layout) {
  // A folder of this test's own (ctest -j runs the tests of this file at once, each in its process).
  const std::filesystem::path dir =
      ::testing::TempDir() + fmt::format("serve_deepep_trace_{}_{}",
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                                         ::getpid());
  std::filesystem::remove_all(dir);
  std::vector<std::string> args = layout;
  args.insert(args.end(), {"--trace-dir", dir.string()});
  Decode d;
  {
    ServerProcess s(server_args(tiny, args));
    EXPECT_GT(s.port(), 0) << s.log();
    if (s.port() <= 0) return d;
    EXPECT_EQ(token_ids(post_json(s.port(), "/v1/completions", greedy_body({1, 2, 3}, 5))).size(), 5u);
    EXPECT_EQ(s.stop(), 0) << s.output();
  }
  const json ps[2] = {read_trace(dir), read_trace(dir / "rank1")};
  for (const auto& st : ps[0]["steps"])
    if (st["step"] == "decode") d.passes = st["passes"];
  EXPECT_EQ(d.passes, 4) << ps[0].dump();  // 5 tokens: a prefill, then 4 decode steps of one row
  if (d.passes == 0) return d;
  for (int r = 0; r < 2; ++r) {
    for (const auto& c : ps[r]["collectives"]["traced"]) {
      const std::string group = c["group"];
      if (c["step"] != "decode" || group == "control" || group == "dp_control") continue;
      auto& [g, n, count, bytes] = d.traced[r][c["name"].get<std::string>()];
      g = group;
      n = c["group_size"].get<int64_t>();
      count += 1.0 / double(d.passes);
      bytes += c["bytes"].get<double>() / double(d.passes);
    }
  }
  for (const auto& c : ps[0]["collectives"]["what_if"]["collectives"]) {
    if (c["step"] != "decode") continue;
    const std::string name = c["name"];
    d.planned[name] = {c["group"].get<std::string>(), c["group_size"].get<int64_t>(),
                       c["count_per_step"].get<double>(), c["bytes_per_step"].get<double>()};
    d.planned_meta[name] = c["meta_bytes_per_step"].get<double>();
    d.planned_scale[name] = c["scale_bytes_per_step"].get<double>();
  }
  return d;
}

// Every rank runs the plan's collectives, as many per step, in the plan's groups; the bytes are the plan's
// with the activations f32 here (its bf16 bytes twice over) and the dispatch's routing (meta) and the pair
// counts as they are. The dispatch and combine are the plan's for the average rank (the deployment's
// tokens / tp rows: what a rank sends depends on where its rows are and where their experts are), so the
// ranks' sum is checked there: tp times the plan's.
void expect_the_plans(const Decode& d) {
  Entries each, sum;  // what each rank sends; what the ranks send together
  for (const auto& [name, e] : d.planned) {
    auto [g, n, count, bytes] = e;
    if (name == "ep_dispatch") {
      EXPECT_EQ(d.planned_scale.at(name), 0.0) << "tiny's experts are bf16: no FP8 dispatch";
      sum[name] = {g, n, count, 2 * (2 * bytes + d.planned_meta.at(name))};
    } else if (name == "ep_combine") {
      sum[name] = {g, n, count, 2 * 2 * bytes};
    } else {
      each[name] = {g, n, count, name == "ep_dispatch_layout" ? bytes : 2 * bytes};
    }
  }
  Entries got_sum;
  for (int r = 0; r < 2; ++r) {
    Entries mine;
    for (const auto& [name, e] : d.traced[r]) {
      if (!sum.count(name)) {
        mine[name] = e;
        continue;
      }
      EXPECT_EQ(std::get<0>(e), std::get<0>(sum[name])) << "rank " << r << " " << name;
      EXPECT_EQ(std::get<2>(e), std::get<2>(sum[name])) << "rank " << r << " " << name;
      auto& [g, n, count, bytes] = got_sum[name];
      std::tie(g, n, count) = std::make_tuple(std::get<0>(e), std::get<1>(e), std::get<2>(e));
      bytes += std::get<3>(e);
    }
    EXPECT_EQ(mine, each) << "rank " << r;
  }
  EXPECT_EQ(got_sum, sum);
}

// tiny: 4 layers (1 dense, 3 MoE), hidden 128, 3 picks of 8 experts. --tp 2 --ep-size 2 deepep: the
// embedding all-reduce; the dense layer's o_proj and MLP all-reduces; per MoE layer o_proj's
// reduce-scatter to each rank's rows, the pair counts, the dispatch, the combine and the all-gather at the
// layer boundary; the LM head's all-gather.
TEST_F(ServeDeepep, TracedCollectivesOfADecodeStepAreThePlans) {
  const Decode d = decode_collectives(tiny_, {"--tp", "2", "--ep-size", "2", "--moe-a2a-backend", "deepep"});
  ASSERT_GT(d.passes, 0);
  EXPECT_EQ(d.traced[0].size(), 9u) << ::testing::PrintToString(d.traced[0]);
  for (const char* n :
       {"ep_dispatch_layout", "ep_dispatch", "ep_combine", "attn_tp_reduce_scatter", "attn_tp_all_gather"}) {
    ASSERT_TRUE(d.traced[0].count(n)) << n;
    EXPECT_EQ(std::get<2>(d.traced[0].at(n)), 3.0) << n;  // one per MoE layer
  }
  EXPECT_EQ(std::get<0>(d.traced[0].at("ep_dispatch")), "ep");
  // The step's one row is rank 0's: its 3 picks a layer, f32 rows + expert + weight; rank 1 sends none.
  EXPECT_EQ(std::get<3>(d.traced[0].at("ep_dispatch")), 3 * 3 * (128 * 4 + 8));
  EXPECT_EQ(std::get<3>(d.traced[1].at("ep_dispatch")), 0.0);
  expect_the_plans(d);
}

// With attention DP (--attn-dp-size 2, attention TP 1) the MoE layers run no DP gathers: each rank
// dispatches its own DP group's rows (rank 0 the request's one row a step; rank 1, idle, zero rows, and
// its combine sends back what rank 0 dispatched to its experts), and only the dense layer's MLP gathers
// and scatters over the world (padded: one row a rank). The plan keeps the article's DP gathers around the
// MoE layers in its count only (runs: false): they are not among the trace's planned collectives either.
TEST_F(ServeDeepep, TracedCollectivesOfAnAttentionDpDecodeStepAreThePlans) {
  const Decode d = decode_collectives(
      tiny_, {"--tp", "2", "--ep-size", "2", "--attn-dp-size", "2", "--moe-a2a-backend", "deepep"});
  ASSERT_GT(d.passes, 0);
  for (int r = 0; r < 2; ++r) {
    const Entries& t = d.traced[r];
    EXPECT_EQ(t.size(), 5u) << "rank " << r << " " << ::testing::PrintToString(t);
    auto traced = [&](const char* n) { return t.count(n) ? t.at(n) : Entry{}; };
    EXPECT_EQ(std::get<2>(traced("dp_all_gather")), 1.0) << r;  // the dense layer only
    EXPECT_EQ(std::get<3>(traced("dp_all_gather")), 2 * 128 * 4) << r;
    EXPECT_EQ(std::get<2>(traced("dp_reduce_scatter")), 1.0) << r;
    EXPECT_EQ(std::get<2>(traced("ep_dispatch")), 3.0) << r;
    EXPECT_EQ(std::get<3>(traced("ep_dispatch")), r == 0 ? 3 * 3 * (128 * 4 + 8) : 0.0) << r;
  }
  expect_the_plans(d);
}

// A rank killed while every rank of the deployment is in a step's dispatch / combine exchanges (most of
// tiny's collectives under DeepEP), with and without attention DP (an idle rank takes part with zero rows).
TEST_F(ServeDeepep, AKilledRankEndsTheServerWithAnError) {
  expect_a_killed_rank_ends_the_server(tiny_, {"--tp", "2", "--ep-size", "2", "--moe-a2a-backend", "deepep"},
                                       1);
  expect_a_killed_rank_ends_the_server(tiny_, {"--tp", "2", "--ep-size", "2", "--moe-a2a-backend", "deepep"},
                                       0);
  expect_a_killed_rank_ends_the_server(
      tiny_, {"--tp", "2", "--ep-size", "2", "--attn-dp-size", "2", "--moe-a2a-backend", "deepep"}, 1);
}

}  // namespace
}  // namespace dsaserve::testing
