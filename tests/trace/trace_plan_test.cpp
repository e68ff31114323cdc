// issue 9: the plan for the fixture models matches what `dsaserve score --trace-dir` records on the CPU
// path, op by op: the same op names in the same order for every layer of each kind, in the prefill, the
// decode steps and the MTP layer's passes (a fused kernel's span joins the plan's names with '+').
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/fixtures.h"

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

// The op spans of `pass` must repeat the plan's chain of the layer's kind, whole, once per forward pass
// that ran it (`passes` times); every planned layer is traced and no other. Returns the planned seconds
// per key (layer kinds, head and tail) for the time table.
void expect_matches(const json& trace, const json& plan, const std::string& step,
                    const std::string& pass_name, int64_t passes, std::map<std::string, double>& planned_s) {
  SCOPED_TRACE(step + "/" + pass_name);
  const json* pass = nullptr;
  for (const json& p : plan["steps"][step]["passes"]) {
    if (p["name"] == pass_name) pass = &p;
  }
  ASSERT_NE(pass, nullptr) << "the plan has no pass " << pass_name;
  std::map<std::string, std::vector<std::string>> planned;  // kind -> op names
  std::map<int64_t, std::string> layer_kind;
  for (const json& k : (*pass)["layer_kinds"]) {
    for (const json& o : k["ops"]) {
      planned[k["name"]].push_back(o["name"]);
      planned_s[o["key"]] = o["time_s"];
    }
    for (const json& l : k["layers"]) layer_kind[l.get<int64_t>()] = k["name"];
  }
  for (const char* part : {"head", "tail"}) {
    for (const json& o : (*pass)[part]["ops"]) planned_s[o["key"]] = o["time_s"];
  }

  std::vector<json> ops;  // op spans of this pass inside layers, in start order
  for (const json& e : trace["traceEvents"]) {
    if (e["cat"] == "op" && e["args"]["step"] == step && e["args"]["pass"] == pass_name &&
        e["args"]["layer"].get<int64_t>() >= 0) {
      ops.push_back(e);
    }
  }
  std::stable_sort(ops.begin(), ops.end(), [](const json& a, const json& b) {
    return a["ts"].get<double>() < b["ts"].get<double>();
  });
  std::map<int64_t, std::vector<std::string>> recorded;
  std::map<int64_t, std::string> recorded_kind;
  for (const json& e : ops) {
    const int64_t l = e["args"]["layer"];
    recorded_kind[l] = e["args"]["kind"];
    for (const auto& n : split_plus(e["name"])) recorded[l].push_back(n);
  }
  ASSERT_EQ(recorded.size(), layer_kind.size()) << "layers recorded vs planned";
  for (const auto& [l, kind] : layer_kind) {
    ASSERT_TRUE(recorded.count(l)) << "layer " << l << " not traced";
    EXPECT_EQ(recorded_kind[l], kind) << "layer " << l;
    std::vector<std::string> want;
    for (int64_t i = 0; i < passes; ++i) want.insert(want.end(), planned[kind].begin(), planned[kind].end());
    EXPECT_EQ(recorded[l], want) << "layer " << l << " (" << kind << "), " << passes << " passes";
  }
}

void check_model(const std::string& name) {
  DSA_FIXTURE_PATH(model, "models/" + name);
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("dsa_trace_{}_{}", name, ::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // More tokens than index_topk of both fixtures (the indexer selects); a prefill of 36, then 4 decode
  // steps, the MTP layer after each.
  constexpr int kTokens = 40, kDecodeFrom = 36;
  std::string ids;
  for (int i = 0; i < kTokens; ++i) ids += fmt::format("{}{}", i ? "," : "", 1 + (i * 7) % 50);
  std::string out;
  const auto bin = dsaserve_binary().string();
  ASSERT_EQ(
      run_command(
          fmt::format("{} score --model {} --ids {} --attention absorbed --decode-from {} --mtp "
                      "--threads 2 --out {} --trace-dir {}",
                      bin, model.string(), ids, kDecodeFrom, (dir / "l.safetensors").string(), dir.string()),
          &out),
      0)
      << out;
  // Without speculative decoding (prefill, decode) and with it (the MTP layer's passes).
  for (const char* spec : {"0", "2"}) {
    ASSERT_EQ(run_command(fmt::format("{} plan --model {} --context {} --prefill-tokens {} "
                                      "--speculative-num-draft-tokens {} --json > {} 2>&1",
                                      bin, model.string(), kTokens, kDecodeFrom, spec,
                                      (dir / fmt::format("plan{}.json", spec)).string()),
                          &out),
              0)
        << out;
  }
  std::filesystem::path trace_path;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("trace-", 0) == 0) trace_path = e.path();
  }
  ASSERT_FALSE(trace_path.empty()) << "no trace-<pid>-<n>.json in " << dir;
  const json trace = read_json(trace_path), plan = read_json(dir / "plan0.json"),
             plan_mtp = read_json(dir / "plan2.json");

  std::map<std::string, double> planned_s;  // key -> seconds
  const int64_t decodes = kTokens - kDecodeFrom;
  expect_matches(trace, plan, "prefill", "prefill", 1, planned_s);
  expect_matches(trace, plan, "decode", "decode", decodes, planned_s);
  expect_matches(trace, plan_mtp, "prefill", "prefill_draft_extend", 1, planned_s);
  // score runs the MTP layer on the one new token of each decode step but the last (whose next token
  // is unknown): one-token MTP passes, which the trace names "draft".
  expect_matches(trace, plan_mtp, "decode", "draft", decodes - 1, planned_s);

  // Measured vs planned per op (the plan's roofline is an H200's: on a CPU the ratio is informative only).
  fmt::print("{}: measured (CPU, whole run) vs planned (H200 roofline, one pass) per op\n", name);
  for (const json& row : trace["summary"]) {
    const std::string key = row["key"];
    const auto slash = key.rfind('/');
    if (key.rfind("kernel/", 0) == 0 || key.rfind("layer/", 0) == 0) continue;
    double plan_s = 0;
    for (const auto& part : split_plus(key.substr(slash + 1))) {
      const auto it = planned_s.find(key.substr(0, slash + 1) + part);
      if (it != planned_s.end()) plan_s += it->second;
    }
    fmt::print("  {:<72} x{:<3} {:>10.1f} us  plan {:>8.3f} us\n", key, row["count"].get<int64_t>(),
               row["total_us"].get<double>(), plan_s * 1e6);
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
