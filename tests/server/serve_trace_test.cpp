// issue 9: `dsaserve serve --trace-dir D` on the built-in demo model. The real binary serves a few
// requests and is stopped with SIGTERM; its trace files hold the engine's phases per step (schedule,
// build_batch, launch, wait, sample, postprocess inside a step span, with the batch's args), the model's
// layer/op spans from the runner's thread nested inside the forward (between launch and wait), a
// summary whose op keys are keys of `dsaserve plan --config configs/dsaserve-tiny.json --json`, and the
// measured vs planned summary (plan_summary) pricing every traced pass's batch.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "server/server_process.h"  // tests/server/

namespace dsaserve::testing {
namespace {

using nlohmann::json;

json read_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  return json::parse(f, nullptr, false);
}

// Every op key of the plan (all steps and passes; "step/pass/kind/op").
std::set<std::string> plan_keys(const json& plan) {
  std::set<std::string> keys;
  for (const auto& [step, s] : plan["steps"].items()) {
    for (const json& p : s["passes"]) {
      for (const json& k : p["layer_kinds"]) {
        for (const json& o : k["ops"]) keys.insert(o["key"].get<std::string>());
      }
      for (const char* part : {"head", "tail"}) {
        if (!p.contains(part)) continue;
        for (const json& o : p[part]["ops"]) keys.insert(o["key"].get<std::string>());
      }
    }
  }
  return keys;
}

std::vector<std::filesystem::path> trace_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("trace-", 0) == 0) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

class ServeTrace : public ::testing::TestWithParam<bool> {};

TEST_P(ServeTrace, EnginePhasesAndModelOpsMatchThePlan) {
  const bool overlap = GetParam();
  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("dsaserve-serve-trace-{}-{}", ::getpid(), overlap ? 1 : 0);
  std::filesystem::remove_all(dir);
  std::vector<std::string> args = {"--model",    "builtin:demo",        "--trace-dir",
                                   dir.string(), "--trace-flush-steps", "8"};
  if (!overlap) args.push_back("--disable-overlap-schedule");
  int64_t completion_tokens = 0;
  {
    ServerProcess server(args);
    ASSERT_GT(server.port(), 0) << server.log();
    // First, alone: a one-token prompt (token ids), whose first step is a prefill of 1 token, not a decode.
    for (int i = -1; i < 3; ++i) {
      const json body = {{"model", "builtin:demo"},
                         {"prompt", i < 0 ? json::array({5}) : json(fmt::format("hello trace {}", i))},
                         {"max_tokens", 6},
                         {"temperature", 0}};
      const HttpResult r = post_json(server.port(), "/v1/completions", body);
      ASSERT_EQ(r.status, 200) << r.body;
      completion_tokens += r.json()["usage"]["completion_tokens"].get<int64_t>();
    }
    ASSERT_EQ(server.stop(), 0);
  }
  ASSERT_GE(completion_tokens, 3);
  const auto files = trace_files(dir);
  // 3 requests of at most 6 tokens run more than 8 steps: a periodic file and the one at shutdown.
  ASSERT_GE(files.size(), 2u) << "expected a periodic flush and the shutdown one in " << dir;

  std::string plan_out;
  const auto plan_path = dir / "plan.json";
  ASSERT_EQ(run_command(fmt::format("{} plan --config {}/configs/dsaserve-tiny.json --json > {} 2>&1",
                                    dsaserve_binary().string(), DSASERVE_SOURCE_DIR, plan_path.string()),
                        &plan_out),
            0)
      << plan_out;
  const std::set<std::string> keys = plan_keys(read_json(plan_path));
  ASSERT_FALSE(keys.empty());

  std::vector<json> events;
  int64_t summarized_ops = 0, planned_passes = 0;
  std::set<std::string> planned_steps;
  for (const auto& f : files) {
    const json t = read_json(f);
    ASSERT_TRUE(t.is_object() && t.contains("traceEvents")) << f;
    EXPECT_EQ(t["dropped_events"], 0) << f;
    for (const json& e : t["traceEvents"]) events.push_back(e);
    for (const json& row : t["summary"]) {
      const std::string key = row["key"];
      if (key.rfind("kernel/", 0) == 0 || key.rfind("layer/", 0) == 0) continue;
      // A fused kernel's op joins the plan's op names with '+': each part is a planned key.
      const size_t slash = key.rfind('/');
      const std::string prefix = key.substr(0, slash + 1), ops = key.substr(slash + 1);
      size_t at = 0;
      while (at <= ops.size()) {
        const size_t plus = std::min(ops.find('+', at), ops.size());
        EXPECT_TRUE(keys.count(prefix + ops.substr(at, plus - at))) << "not a plan key: " << key;
        at = plus + 1;
      }
      summarized_ops += row["count"].get<int64_t>();
    }
    // Measured vs planned: every op span of a pass in this file priced by the plan for its batch.
    const json& ps = t["plan_summary"];
    ASSERT_TRUE(ps.is_object() && !ps.contains("error")) << f << ": " << ps.dump();
    int64_t file_ops = 0, priced = 0;
    for (const json& e : t["traceEvents"]) file_ops += e["cat"] == "op";
    for (const json& row : ps["rows"]) {
      EXPECT_TRUE(row["planned"].get<bool>()) << row.dump();
      EXPECT_GT(row["planned_us"].get<double>(), 0.0) << row.dump();
      priced += row["count"].get<int64_t>();
    }
    EXPECT_EQ(priced + ps["op_spans_without_pass"].get<int64_t>(), file_ops) << f;
    planned_passes += ps["passes"].get<int64_t>();
    for (const json& st : ps["steps"]) planned_steps.insert(st["step"].get<std::string>());
  }
  EXPECT_GT(summarized_ops, 0);
  EXPECT_GT(planned_passes, 0);
  EXPECT_EQ(planned_steps, (std::set<std::string>{"decode", "prefill"}));

  // Engine phases, by step number.
  std::map<int64_t, std::map<std::string, std::vector<json>>> phases;
  std::vector<json> steps, ops, layers;
  std::set<int64_t> request_ids;
  for (const json& e : events) {
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    EXPECT_GE(e["ts"].get<double>(), 0.0);
    if (e["cat"] == "engine") {
      if (e["name"] == "step") {
        if (e["args"]["batch_size"].get<int64_t>() > 0) steps.push_back(e);
      } else if (e["args"].contains("step")) {
        phases[e["args"]["step"].get<int64_t>()][e["name"]].push_back(e);
      }
    } else if (e["cat"] == "op") {
      ops.push_back(e);
    } else if (e["cat"] == "layer") {
      layers.push_back(e);
    }
  }
  ASSERT_FALSE(steps.empty());
  ASSERT_FALSE(ops.empty()) << "no model op spans from the runner's thread";
  ASSERT_FALSE(layers.empty());
  int64_t prefill_tokens = 0, decode_tokens = 0;
  for (const json& s : steps) {
    const int64_t n = s["args"]["step"];
    SCOPED_TRACE(fmt::format("step {}", n));
    const auto& ph = phases[n];
    for (const char* name : {"schedule", "build_batch", "launch", "wait", "sample"}) {
      EXPECT_TRUE(ph.count(name)) << "no " << name << " span";
    }
    if (!ph.count("launch") || !ph.count("wait") || !ph.count("sample") || !ph.count("schedule")) continue;
    const json& launch = ph.at("launch")[0];
    EXPECT_EQ(launch["args"]["batch_size"], s["args"]["batch_size"]);
    EXPECT_EQ(launch["args"]["request_ids"].size(), s["args"]["batch_size"].get<size_t>());
    for (const json& id : launch["args"]["request_ids"]) request_ids.insert(id.get<int64_t>());
    prefill_tokens += launch["args"]["prefill_tokens"].get<int64_t>();
    decode_tokens += launch["args"]["decode_tokens"].get<int64_t>();
    // Phases of one step, in order: schedule inside the step span; launch, then wait, then sample.
    const double s0 = s["ts"], s1 = s0 + s["dur"].get<double>();
    // (A step whose batch emptied once the previous one's samples were known launched nothing and kept
    // its number: take the schedule span inside this step's span.)
    const json* sched_p = nullptr;
    for (const json& e : ph.at("schedule")) {
      if (e["ts"].get<double>() >= s0 && e["ts"].get<double>() + e["dur"].get<double>() <= s1 + 1.0)
        sched_p = &e;
    }
    ASSERT_NE(sched_p, nullptr) << "no schedule span inside the step span";
    const json& sched = *sched_p;
    EXPECT_LE(sched["ts"].get<double>(), launch["ts"].get<double>());
    const json& wait = ph.at("wait")[0];
    const json& sample = ph.at("sample")[0];
    EXPECT_GE(wait["ts"].get<double>(), launch["ts"].get<double>());
    EXPECT_GE(sample["ts"].get<double>() + 1.0, wait["ts"].get<double>() + wait["dur"].get<double>());
    EXPECT_EQ(sched["tid"], launch["tid"]);  // the engine thread
  }
  EXPECT_EQ(request_ids.size(), 4u);
  {
    // The first step ran the one-token prompt alone: a prefill of 1 token, and so is its forward pass.
    const json* first = &steps[0];
    for (const json& s : steps) {
      if (s["args"]["step"].get<int64_t>() < (*first)["args"]["step"].get<int64_t>()) first = &s;
    }
    const json& launch = phases[(*first)["args"]["step"].get<int64_t>()].at("launch")[0];
    EXPECT_EQ(launch["args"]["prefill_tokens"], 1) << launch.dump();
    EXPECT_EQ(launch["args"]["decode_tokens"], 0) << launch.dump();
    const json* first_pass = nullptr;
    for (const json& e : events) {
      if (e["cat"] == "pass" &&
          (first_pass == nullptr || e["ts"].get<double>() < (*first_pass)["ts"].get<double>()))
        first_pass = &e;
    }
    ASSERT_NE(first_pass, nullptr) << "no forward pass span";
    EXPECT_EQ((*first_pass)["args"]["step"], "prefill");
  }
  EXPECT_GT(prefill_tokens, 0);
  EXPECT_GT(decode_tokens, 0);

  // The model's spans run on the runner's thread (overlap) and lie within some step's launch..wait end.
  std::set<json> engine_tids;
  for (const json& s : steps) engine_tids.insert(s["tid"]);
  int64_t inside = 0;
  for (const json& o : ops) {
    const double t0 = o["ts"], t1 = t0 + o["dur"].get<double>();
    for (const auto& [n, ph] : phases) {
      if (!ph.count("launch") || !ph.count("wait")) continue;
      const json& l = ph.at("launch")[0];
      const json& w = ph.at("wait")[0];
      if (t0 + 1.0 >= l["ts"].get<double>() && t1 <= w["ts"].get<double>() + w["dur"].get<double>() + 1.0) {
        inside += 1;
        break;
      }
    }
    if (overlap) {
      EXPECT_FALSE(engine_tids.count(o["tid"])) << "op span on the engine thread with overlap";
    }
  }
  EXPECT_EQ(inside, int64_t(ops.size())) << "op spans outside any step's launch..wait";
  // Every op lies within a layer span of its thread (op spans inside layers carry layer >= 0).
  int64_t nested = 0, in_layers = 0;
  for (const json& o : ops) {
    if (o["args"]["layer"].get<int64_t>() < 0) continue;
    in_layers += 1;
    const double t0 = o["ts"], t1 = t0 + o["dur"].get<double>();
    for (const json& l : layers) {
      if (l["tid"] == o["tid"] && l["args"]["layer"] == o["args"]["layer"] && l["ts"].get<double>() <= t0 &&
          t1 <= l["ts"].get<double>() + l["dur"].get<double>() + 1e-3) {
        nested += 1;
        break;
      }
    }
  }
  EXPECT_GT(in_layers, 0);
  EXPECT_EQ(nested, in_layers);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Overlap, ServeTrace, ::testing::Bool(), [](const ::testing::TestParamInfo<bool>& p) {
  return p.param ? "overlap" : "no_overlap";
});

}  // namespace
}  // namespace dsaserve::testing
