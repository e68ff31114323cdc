// issue 9: the plan for the fixture models matches what `dsaserve score --trace-dir` records on the CPU
// path, op by op (same op names in the same order for every layer of each kind, prefill).
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

void check_model(const std::string& name) {
  DSA_FIXTURE_PATH(model, "models/" + name);
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("dsa_trace_{}_{}", name, ::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  constexpr int kTokens = 40;  // more than index_topk of both fixtures: the indexer selects
  std::string ids;
  for (int i = 0; i < kTokens; ++i) ids += fmt::format("{}{}", i ? "," : "", 1 + (i * 7) % 50);
  std::string out;
  const auto bin = dsaserve_binary().string();
  ASSERT_EQ(run_command(fmt::format("{} score --model {} --ids {} --attention absorbed --threads 2 --out {} "
                                    "--trace-dir {}",
                                    bin, model.string(), ids, (dir / "l.safetensors").string(), dir.string()),
                        &out),
            0)
      << out;
  ASSERT_EQ(run_command(fmt::format("{} plan --model {} --context {} --json > {} 2>&1", bin, model.string(),
                                    kTokens, (dir / "plan.json").string()),
                        &out),
            0)
      << out;
  std::filesystem::path trace_path;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("trace-", 0) == 0) trace_path = e.path();
  }
  ASSERT_FALSE(trace_path.empty()) << "no trace-<pid>-<n>.json in " << dir;
  std::ifstream tf(trace_path), pf(dir / "plan.json");
  const json trace = json::parse(tf), plan = json::parse(pf);

  // The plan's prefill pass: op chain and planned time per layer kind.
  const json* pass = nullptr;
  for (const json& p : plan["steps"]["prefill"]["passes"]) {
    if (p["name"] == "prefill") pass = &p;
  }
  ASSERT_NE(pass, nullptr);
  std::map<std::string, std::vector<std::string>> planned;  // kind -> op names
  std::map<std::string, double> planned_s;                  // key -> seconds
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

  // The trace: op spans of the prefill pass per layer, in start order.
  std::vector<json> ops;
  for (const json& e : trace["traceEvents"]) {
    if (e["cat"] == "op" && e["args"]["pass"] == "prefill" && e["args"]["layer"].get<int64_t>() >= 0)
      ops.push_back(e);
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
    EXPECT_EQ(recorded[l], planned[kind]) << name << " layer " << l << " (" << kind << ")";
  }

  // Measured vs planned per op (the plan's roofline is an H200's: on a CPU the ratio is informative only).
  fmt::print("{}: measured (CPU) vs planned (H200 roofline) per op, prefill of {} tokens\n", name, kTokens);
  for (const json& row : trace["summary"]) {
    const std::string key = row["key"];
    if (key.rfind("prefill/prefill/", 0) != 0) continue;
    double plan_s = 0;
    for (const auto& part : split_plus(key.substr(key.rfind('/') + 1))) {
      const auto it = planned_s.find(key.substr(0, key.rfind('/') + 1) + part);
      if (it != planned_s.end()) plan_s += it->second;
    }
    fmt::print("  {:<70} x{:<3} {:>10.1f} us  plan {:>8.3f} us\n", key, row["count"].get<int64_t>(),
               row["total_us"].get<double>(), plan_s * 1e6);
  }
  std::filesystem::remove_all(dir);
}

TEST(TracePlan, TinyPrefillOpsMatchThePlan) { check_model("tiny"); }
TEST(TracePlan, RealdimsPrefillOpsMatchThePlan) { check_model("realdims"); }

}  // namespace
}  // namespace dsaserve::testing
