// End-to-end: runs the real dsaserve binary's plan subcommand.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/fixtures.h"

namespace dsaserve {
namespace {

using testing::dsaserve_binary;
using testing::run_command;

TEST(PlanCli, ArticleLayoutJson) {
  DSA_FIXTURE_PATH(cfg, "configs/glm-5.3.json");
  std::string out;
  ASSERT_EQ(
      run_command(fmt::format("{} plan --config {} --tp 8 --ep-size 8 --attn-dp-size 8 --kv-cache-dtype "
                              "fp8_e4m3 --batch 32 --context 131072 --json 2>&1",
                              dsaserve_binary().string(), cfg.string()),
                  &out),
      0)
      << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["deployment"]["attn_tp_size"], 1);
  EXPECT_EQ(j["deployment"]["moe_a2a_backend"], "deepep");  // auto with --ep-size > 1
  EXPECT_EQ(j["memory"]["kv_values_per_token"], 44928);
  EXPECT_NEAR(j["memory"]["routed_expert_bytes"].get<double>() / 1e9, 90.6, 0.1);
  EXPECT_EQ(j["memory"]["batch_fits"], false);
  const auto& dec = j["steps"]["decode"];
  ASSERT_EQ(dec["passes"].size(), 1u);
  const auto& kinds = dec["passes"][0]["layer_kinds"];
  ASSERT_EQ(kinds.size(), 3u);
  int64_t layers = 0;
  for (const auto& k : kinds) {
    layers += int64_t(k["layers"].size());
    // Stable op records: the chain starts with the input norm and the A projection, ends with the MLP.
    EXPECT_EQ(k["ops"][0]["name"], "input_layernorm");
    EXPECT_EQ(k["ops"][1]["name"], "qkv_a_proj");
    EXPECT_EQ(k["collectives"][0]["name"], "dp_all_gather");
    EXPECT_EQ(k["collectives"][0]["bytes"], 393216.0);
    EXPECT_EQ(k["collectives"][0]["after"], "post_attention_layernorm");
    for (const auto& op : k["ops"]) {
      EXPECT_GE(op["time_s"].get<double>(), 0);
      EXPECT_FALSE(op["shape"].get<std::string>().empty());
    }
  }
  EXPECT_EQ(layers, 78);
  const double t = dec["totals"]["time_s"].get<double>();
  EXPECT_GT(t, j["memory"]["expert_read_floor_s"].get<double>() * 0.5);
  EXPECT_LT(t, 0.1);
  EXPECT_NEAR(dec["totals"]["article_bytes_per_output_token"].get<double>(), 12976128.0, 1);
}

TEST(PlanCli, KeysAreUniqueAndModelDirWorks) {
  DSA_FIXTURE_PATH(tiny, "models/tiny");
  std::string out;
  ASSERT_EQ(
      run_command(fmt::format("{} plan --model {} --tp 2 --ep-size 2 --attn-dp-size 2 --batch 4 --context 64 "
                              "--speculative-num-draft-tokens 3 --json",
                              dsaserve_binary().string(), tiny.string()),
                  &out),
      0)
      << out;
  const auto j = nlohmann::json::parse(out);
  std::set<std::string> keys;
  size_t n = 0;
  for (const char* step : {"prefill", "decode"}) {
    for (const auto& pass : j["steps"][step]["passes"]) {
      auto add = [&](const nlohmann::json& arr) {
        for (const auto& r : arr) {
          keys.insert(r["key"].get<std::string>());
          ++n;
        }
      };
      add(pass["head"]["ops"]);
      add(pass["head"]["collectives"]);
      add(pass["tail"]["ops"]);
      add(pass["tail"]["collectives"]);
      for (const auto& k : pass["layer_kinds"]) {
        add(k["ops"]);
        add(k["collectives"]);
        // Each collective follows an op of its layer kind, so a trace can order them.
        for (const auto& c : k["collectives"]) {
          bool found = false;
          for (const auto& o : k["ops"]) found = found || o["name"] == c["after"];
          EXPECT_TRUE(found) << c["key"];
        }
      }
    }
  }
  EXPECT_EQ(keys.size(), n);
  EXPECT_TRUE(keys.count("decode/verify/moe.full/sparse_mla"));
  EXPECT_TRUE(keys.count("decode/draft/mtp/mtp_eh_proj"));
  EXPECT_TRUE(keys.count("decode/verify/moe.full/ep_dispatch"));
  EXPECT_TRUE(keys.count("prefill/prefill/dense.full/dp_all_gather"));
}

// DeepEP's dispatch on an FP8 model: FP8 codes, a scale per 128 values and each pair's expert and weight,
// after the pair counts; --deepep-bf16-dispatch (SGLANG_DEEPEP_BF16_DISPATCH): bf16 rows, no scales.
TEST(PlanCli, DeepepFp8OrBf16Dispatch) {
  DSA_FIXTURE_PATH(cfg, "configs/glm-5.3.json");
  for (const bool bf16 : {false, true}) {
    std::string out;
    ASSERT_EQ(run_command(
                  fmt::format("{} plan --config {} --tp 8 --ep-size 8 --attn-dp-size 8 --batch 32 {} "
                              "--json 2>&1",
                              dsaserve_binary().string(), cfg.string(), bf16 ? "--deepep-bf16-dispatch" : ""),
                  &out),
              0)
        << out;
    const auto j = nlohmann::json::parse(out);
    EXPECT_EQ(j["deployment"]["deepep_fp8_dispatch"], !bf16);
    std::map<std::string, nlohmann::json> c;
    for (const auto& p : j["steps"]["decode"]["passes"])
      for (const auto& k : p["layer_kinds"])
        for (const auto& x : k["collectives"]) c[x["key"].get<std::string>()] = x;
    const nlohmann::json& d = c.at("decode/decode/moe.shared/ep_dispatch");
    // 4 tokens per rank x 8 picks x 6144.
    EXPECT_EQ(d["bytes"].get<double>(), 4.0 * 8 * 6144 * (bf16 ? 2 : 1));
    EXPECT_EQ(d["scale_bytes"].get<double>(), bf16 ? 0.0 : 4.0 * 8 * 48 * 4);
    EXPECT_EQ(d["meta_bytes"].get<double>(), 4.0 * 8 * 8);
    EXPECT_EQ(c.at("decode/decode/moe.shared/ep_dispatch_layout")["bytes"].get<double>(), 8.0 * 8);
    EXPECT_EQ(c.at("decode/decode/moe.shared/ep_combine")["bytes"].get<double>(), 4.0 * 8 * 6144 * 2);
  }
}

TEST(PlanCli, TextReportAndInterconnect) {
  DSA_FIXTURE_PATH(cfg, "configs/deepseek-v3.2.json");
  std::string out;
  ASSERT_EQ(
      run_command(fmt::format("{} plan --config {} --tp 8 --batch 8 --context 16384 --interconnect-gbps 450 "
                              "--speculative-num-draft-tokens 4 2>&1",
                              dsaserve_binary().string(), cfg.string()),
                  &out),
      0)
      << out;
  for (const char* s : {"== memory per GPU ==", "== prefill ==", "== decode ==", "-- pass verify x1",
                        "-- pass draft x3 (MTP layer)", "attn_tp_all_reduce", "lm_head_all_gather",
                        "interconnect 450 GB/s", "estimate (no overlap)"}) {
    EXPECT_NE(out.find(s), std::string::npos) << s << "\n" << out.substr(0, 2000);
  }
}

TEST(PlanCli, BadFlagsExitNonZeroWithOneLine) {
  DSA_FIXTURE_PATH(cfg, "configs/glm-5.3.json");
  const std::string bin = dsaserve_binary().string();
  struct Case {
    std::string flags, message;
  };
  for (const Case& c : {Case{"--tp 8 --ep-size 3", "--tp 8 is not divisible by --ep-size 3"},
                        Case{"--tp 3", "num_attention_heads 64 is not divisible by the attention TP size 3"},
                        Case{"--kv-cache-dtype fp4", "--kv-cache-dtype must be"},
                        Case{"--moe-a2a-backend mooncake", "--moe-a2a-backend must be"},
                        Case{"--gpu b200", "--gpu 'b200' is not known"},
                        Case{"--interconnect-gbps -5", "--interconnect-gbps must be > 0"}}) {
    std::string out;
    EXPECT_EQ(run_command(fmt::format("{} plan --config {} {} 2>&1", bin, cfg.string(), c.flags), &out), 1)
        << c.flags;
    EXPECT_NE(out.find("error: plan: " + c.message), std::string::npos) << c.flags << ": " << out;
  }
  std::string out;
  EXPECT_NE(run_command(fmt::format("{} plan --tp 8 2>&1", bin), &out), 0);
  EXPECT_NE(out.find("give --model DIR or --config FILE"), std::string::npos) << out;
}

}  // namespace
}  // namespace dsaserve
