// issue 9: the plan for the fixture models matches what `dsaserve score --trace-dir` records on the CPU
// path, op by op: every forward pass (prefill, chunks, decode steps, the MTP layer's passes) against
// plan::plan_step for its exact batch, with the same ops in the same order and the same shapes (a fused
// kernel's span joins the plan's names with '+' and carries one shape per part).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "common/fixtures.h"
#include "model/config.h"
#include "plan/step.h"

namespace dsaserve::testing {
namespace {

using nlohmann::json;

std::vector<std::string> split_plus(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string part; std::getline(ss, part, '+');) out.push_back(part);
  return out;
}

json read_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  return json::parse(f);
}

// One op as planned or as traced: where it ran, its name and its shape in the plan's notation.
std::string op_line(int64_t layer, const std::string& kind, const std::string& name, std::string shape) {
  // Not shapes: the plan's expected count of experts hit (routing decides), and the cache's bytes per
  // token (the CPU path keeps f32 caches, the plan prices the deployment's bf16/FP8 format).
  static const std::regex hit(R"( \([0-9.]+ hit\))"), bytes(R"(-> [0-9]+ B/token)");
  shape = std::regex_replace(std::regex_replace(shape, hit, ""), bytes, "-> B/token");
  return fmt::format("layer {} {} {}: {}", layer, kind, name, shape);
}

// The plan's ops of a pass, in execution order (sampling is the engine's, not the forward's).
std::vector<std::string> planned_ops(const plan::Pass& p) {
  std::vector<std::string> out;
  for (const plan::Op& o : p.head_ops) out.push_back(op_line(-1, "head", o.name, o.shape));
  std::map<int64_t, const plan::LayerKindPlan*> by_layer;
  for (const plan::LayerKindPlan& k : p.layer_kinds) {
    for (int64_t l : k.layers) by_layer[l] = &k;
  }
  for (const auto& [l, k] : by_layer) {
    for (const plan::Op& o : k->ops) out.push_back(op_line(l, k->name, o.name, o.shape));
  }
  for (const plan::Op& o : p.tail_ops) {
    if (o.name != "sampling") out.push_back(op_line(-1, "tail", o.name, o.shape));
  }
  return out;
}

// Every forward pass of the trace against plan::plan_step for its exact batch: the same ops, in the same
// order, with the same shapes (any op missing, extra, out of order or of another shape fails). A fused
// span counts as its parts. Returns the passes checked per "step/pass".
std::map<std::string, int> expect_matches(const json& trace, const model::ModelConfig& cfg) {
  std::map<int64_t, std::vector<json>> ops;  // pass_id -> op spans
  for (const json& e : trace["traceEvents"]) {
    if (e["cat"] == "op") ops[e["args"]["pass_id"].get<int64_t>()].push_back(e);
  }
  const plan::Hardware hw = plan::Hardware::named("h200");
  std::map<std::string, int> checked;
  for (const json& e : trace["traceEvents"]) {
    if (e["cat"] != "pass") continue;
    const json& a = e["args"];
    plan::StepShape shape;
    for (const json& r : a["requests"]) shape.requests.push_back({r[0].get<int64_t>(), r[1].get<int64_t>()});
    shape.decode = a["step"] == "decode";
    shape.mtp = a["mtp"];
    shape.all_logits = a["all_logits"];
    const plan::Pass planned = plan::plan_step(cfg, plan::Deployment{}, hw, shape);
    SCOPED_TRACE(fmt::format("pass {} ({}/{}, requests {})", a["pass_id"].get<int64_t>(),
                             a["step"].get<std::string>(), e["name"].get<std::string>(),
                             a["requests"].dump()));
    EXPECT_EQ(planned.name, e["name"].get<std::string>());
    std::vector<json>& spans = ops[a["pass_id"].get<int64_t>()];
    std::stable_sort(spans.begin(), spans.end(), [](const json& x, const json& y) {
      return x["ts"].get<double>() < y["ts"].get<double>();
    });
    std::vector<std::string> traced;
    for (const json& o : spans) {
      const std::vector<std::string> names = split_plus(o["name"]);
      const json& sh = o["args"]["shape"];
      EXPECT_TRUE(sh.is_string() || (sh.is_array() && sh.size() == names.size()))
          << o["name"] << " has no shape per part: " << sh.dump();
      for (size_t i = 0; i < names.size(); ++i) {
        const std::string part_shape = sh.is_array() && i < sh.size() ? sh[i].get<std::string>()
                                       : sh.is_string()               ? sh.get<std::string>()
                                                                      : "?";
        traced.push_back(op_line(o["args"]["layer"], o["args"]["kind"], names[i], part_shape));
      }
    }
    EXPECT_EQ(traced, planned_ops(planned));
    checked[a["step"].get<std::string>() + "/" + e["name"].get<std::string>()] += 1;
  }
  return checked;
}

json run_score(const std::filesystem::path& model, const std::string& args, const std::filesystem::path& dir,
               std::string* out) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto bin = dsaserve_binary().string();
  const int rc =
      run_command(fmt::format("{} score --model {} {} --threads 2 --out {} --trace-dir {}", bin,
                              model.string(), args, (dir / "l.safetensors").string(), dir.string()),
                  out);
  EXPECT_EQ(rc, 0) << *out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("trace-", 0) == 0) return read_json(e.path());
  }
  ADD_FAILURE() << "no trace-<pid>-<n>.json in " << dir;
  return json::object();
}

std::string token_ids(int n) {
  std::string ids;
  for (int i = 0; i < n; ++i) ids += fmt::format("{}{}", i ? "," : "", 1 + (i * 7) % 50);
  return ids;
}

void check_model(const std::string& name) {
  DSA_FIXTURE_PATH(model, "models/" + name);
  const model::ModelConfig cfg = model::ModelConfig::from_file(model / "config.json");
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("dsa_trace_{}_{}", name, ::getpid());
  std::string out;
  {
    // More tokens than index_topk of both fixtures (the indexer selects); a prefill of 36, then 4 decode
    // steps, the MTP layer after each (score runs it on the one new token of each decode step but the
    // last, whose next token is unknown).
    SCOPED_TRACE("prefill, decode, MTP");
    const json trace = run_score(
        model,
        fmt::format("--ids {} --attention absorbed --decode-from 36 --mtp --trace-plan-deployment tp2",
                    token_ids(40)),
        dir, &out);
    const auto checked = expect_matches(trace, cfg);
    const std::map<std::string, int> want = {{"prefill/prefill", 1},
                                             {"decode/decode", 4},
                                             {"prefill/prefill_draft_extend", 1},
                                             {"decode/draft", 3}};
    EXPECT_EQ(checked, want);
    // The trace's measured vs planned summary: every op span priced by the plan for its batch.
    const json& ps = trace["plan_summary"];
    ASSERT_TRUE(ps.is_object()) << "no plan_summary in the trace";
    EXPECT_EQ(ps["passes"], 9);
    EXPECT_EQ(ps["device"], "cpu");
    int64_t spans = 0;
    for (const json& row : ps["rows"]) {
      EXPECT_TRUE(row["planned"].get<bool>()) << row.dump();
      EXPECT_GT(row["planned_us"].get<double>(), 0.0) << row.dump();
      EXPECT_GT(row["measured_us"].get<double>(), 0.0) << row.dump();
      spans += row["count"].get<int64_t>();
    }
    int64_t op_spans = 0;
    for (const json& e : trace["traceEvents"]) op_spans += e["cat"] == "op";
    EXPECT_EQ(spans, op_spans);
    ASSERT_EQ(ps["steps"].size(), 2u);
    EXPECT_NE(ps["collectives"]["note"].get<std::string>().find("no collectives ran"), std::string::npos);
    EXPECT_TRUE(ps["collectives"]["what_if"].is_object()) << "--trace-plan-deployment";
    // score prints it too.
    EXPECT_NE(out.find("measured vs planned per op"), std::string::npos) << out;
    fmt::print("{}\n", out);
  }
  {
    // A chunked prefill (chunks after a cached prefix, the last of one token) and one decode step.
    SCOPED_TRACE("chunked prefill");
    const json trace = run_score(
        model, fmt::format("--ids {} --attention absorbed --chunk 12 --decode-from 37", token_ids(38)), dir,
        &out);
    const auto checked = expect_matches(trace, cfg);
    const std::map<std::string, int> want = {{"prefill/prefill", 4}, {"decode/decode", 1}};
    EXPECT_EQ(checked, want);
  }
  std::filesystem::remove_all(dir);
}

// The step label follows the requests' state, not the token count: a one-token prompt and a prompt's last
// chunk of one token are prefills; only the steps from --decode-from on are decodes.
TEST(TracePlan, OneTokenPromptAndChunkArePrefills) {
  DSA_FIXTURE_PATH(model, "models/tiny");
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("dsa_trace_phase_{}", ::getpid());
  const auto bin = dsaserve_binary().string();
  // 39 tokens in chunks of 12 up to position 37 (12 + 12 + 12 + 1), then 2 decode steps; and a 1-token
  // prompt.
  std::string ids;
  for (int i = 0; i < 39; ++i) ids += fmt::format("{}{}", i ? "," : "", 1 + (i * 5) % 40);
  const std::vector<std::pair<std::string, std::vector<std::string>>> runs = {
      {fmt::format("--ids {} --chunk 12 --decode-from 37", ids),
       {"prefill", "prefill", "prefill", "prefill", "decode", "decode"}},
      {"--ids 7", {"prefill"}},
  };
  for (const auto& [args, want] : runs) {
    SCOPED_TRACE(args);
    std::filesystem::remove_all(dir);
    std::string out;
    ASSERT_EQ(run_command(fmt::format("{} score --model {} {} --threads 2 --out {} --trace-dir {}", bin,
                                      model.string(), args, (dir / "l.safetensors").string(), dir.string()),
                          &out),
              0)
        << out;
    std::filesystem::path trace_path;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (e.path().filename().string().rfind("trace-", 0) == 0) trace_path = e.path();
    }
    ASSERT_FALSE(trace_path.empty());
    const json trace = read_json(trace_path);
    std::vector<std::pair<double, std::string>> passes;  // (start, step) of each forward pass
    for (const json& e : trace["traceEvents"]) {
      if (e["cat"] == "pass")
        passes.emplace_back(e["ts"].get<double>(), e["args"]["step"].get<std::string>());
      if (e["cat"] == "op") {
        EXPECT_NE(e["args"]["pass"], "draft") << "no MTP here";
      }
    }
    std::sort(passes.begin(), passes.end());
    std::vector<std::string> steps;
    for (const auto& p : passes) steps.push_back(p.second);
    EXPECT_EQ(steps, want);
  }
  std::filesystem::remove_all(dir);
}

TEST(TracePlan, TinyOpsMatchThePlan) { check_model("tiny"); }
TEST(TracePlan, RealdimsOpsMatchThePlan) { check_model("realdims"); }

}  // namespace
}  // namespace dsaserve::testing
