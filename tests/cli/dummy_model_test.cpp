// `--load-format dummy` through the real binary at GLM-5.3's full widths (64 heads, 256 experts, hidden
// 6144, vocab 154,880), so width-dependent paths run in CI: inspect reports the widths, generate binds
// and generates, score's logits are finite. Each test starts one process of ~2.8 GB.
//
// The model: glm-5.3.json as config.json, overridden to 2 layers (one dense, one MoE:
// first_k_dense_replace 1) with moe_intermediate_size 128 and tied embeddings. A real MoE layer is 256 x 3 x
// 6144 x 2048 ~ 9.7 G parameters, too big for CI; 128 (one FP8 block) keeps all 256 experts, the router and
// the top-8 routing at full width while the layer is 0.6 GB. The dense layer keeps intermediate 12288.
// The bf16 vocabulary matrices (1.9 GB each) dominate time and memory (making and touching them):
// tie_word_embeddings shares one between the embedding and the LM head, which still runs at vocab 154,880,
// so each process holds ~2.8 GB instead of ~4.7 GB (the must-show run in the README is untied).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/fixtures.h"

namespace dsaserve {
namespace {

using testing::dsaserve_binary;
using testing::run_command;
namespace fs = std::filesystem;

constexpr const char* kTwoLayers =
    R"('{"num_hidden_layers": 2, "first_k_dense_replace": 1, "moe_intermediate_size": 128, )"
    R"("tie_word_embeddings": true}')";

// A folder holding glm-5.3.json as its config.json (no checkpoint).
fs::path config_dir(const fs::path& glm, const std::string& tag = "") {
  const fs::path dir = fs::temp_directory_path() / fmt::format("dsaserve-dummy-{}{}", ::getpid(), tag);
  fs::create_directories(dir);
  fs::copy_file(glm, dir / "config.json", fs::copy_options::overwrite_existing);
  return dir;
}

nlohmann::json json_of(const std::string& out) { return nlohmann::json::parse(out.substr(out.find('{'))); }

TEST(DummyModelCli, InspectReportsTheFullWidths) {
  DSA_FIXTURE_PATH(glm, "configs/glm-5.3.json");
  const fs::path dir = config_dir(glm);
  for (const std::string& model : {dir.string(), glm.string()}) {  // a folder or the config file itself
    std::string out;
    ASSERT_EQ(run_command(fmt::format("{} inspect --model {} --load-format dummy --json-model-override-args "
                                      "'{{\"num_hidden_layers\": 8}}' --json",
                                      dsaserve_binary().string(), model),
                          &out),
              0)
        << out;
    const nlohmann::json r = json_of(out);
    EXPECT_EQ(r["hidden_size"], 6144);
    EXPECT_EQ(r["vocab_size"], 154880);
    EXPECT_EQ(r["num_hidden_layers"], 8);
    EXPECT_EQ(r["attention"]["heads"], 64);
    EXPECT_EQ(r["moe"]["routed_experts"], 256);
    EXPECT_EQ(r["moe"]["moe_intermediate_size"], 2048);
    EXPECT_EQ(r["indexer"]["full_layers"], 4);
    EXPECT_EQ(r["layers"][2]["mlp"], "dense");
    EXPECT_EQ(r["layers"][3]["mlp"], "moe");
    EXPECT_GT(r["dummy_weights"]["bytes_by_dtype"]["F8_E4M3"].get<int64_t>(), int64_t(45) << 30);
  }
  std::string out;
  EXPECT_NE(run_command(fmt::format("{} generate --model {} --prompt-ids 1 --max-new-tokens 1",
                                    dsaserve_binary().string(), glm.string()),
                        &out),
            0);
  EXPECT_NE(out.find("needs --load-format dummy"), std::string::npos) << out;
  fs::remove_all(dir);
}

TEST(DummyModelCli, FullWidthModelGenerates) {
  DSA_FIXTURE_PATH(glm, "configs/glm-5.3.json");
  const fs::path dir = config_dir(glm, "generate");
  const std::string base =
      fmt::format("--model {} --load-format dummy --json-model-override-args {}", dir.string(), kTwoLayers);
  std::string out;
  ASSERT_EQ(run_command(fmt::format("{} generate {} --prompt-ids 1,2,3 --max-new-tokens 3",
                                    dsaserve_binary().string(), base),
                        &out),
            0)
      << out;
  const nlohmann::json g = json_of(out);
  const auto ids = g["output_ids"].get<std::vector<int64_t>>();
  ASSERT_EQ(ids.size(), 3u) << out;
  for (int64_t id : ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 154880);
  }
  std::printf("RESULT full-width dummy generate: %s (load %.1f s, generate %.1f s, %d threads)\n",
              g["output_ids"].dump().c_str(), g["load_seconds"].get<double>(),
              g["generate_seconds"].get<double>(), g["threads"].get<int>());
  fs::remove_all(dir);
}

// score at the same width: every logit finite and of a sane size (a test of its own, so that ctest can run
// it beside the one above).
TEST(DummyModelCli, FullWidthModelScoresFiniteLogits) {
  DSA_FIXTURE_PATH(glm, "configs/glm-5.3.json");
  const fs::path dir = config_dir(glm, "score");
  const std::string base =
      fmt::format("--model {} --load-format dummy --json-model-override-args {}", dir.string(), kTwoLayers);
  std::string out;
  const fs::path logits = dir / "logits.safetensors";
  ASSERT_EQ(run_command(fmt::format("{} score {} --ids 1,2,3,4 --out {}", dsaserve_binary().string(), base,
                                    logits.string()),
                        &out),
            0)
      << out;
  std::ifstream f(logits, std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  const auto t = nlohmann::json::parse(header).at("logits");
  EXPECT_EQ(t["shape"], nlohmann::json::array({4, 154880}));
  const size_t b = t["data_offsets"][0], e = t["data_offsets"][1];
  std::vector<float> v((e - b) / 4);
  f.seekg(std::streamoff(8 + n + b));
  f.read(reinterpret_cast<char*>(v.data()), std::streamsize(e - b));
  double max_abs = 0, sum2 = 0;
  for (float x : v) {
    ASSERT_TRUE(std::isfinite(x));
    max_abs = std::max(max_abs, double(std::fabs(x)));
    sum2 += double(x) * x;
  }
  const double rms = std::sqrt(sum2 / double(v.size()));
  EXPECT_GT(rms, 0.1);
  EXPECT_LT(max_abs, 100.0);
  std::printf("RESULT full-width dummy logits: rms %.3f, max |logit| %.2f\n", rms, max_abs);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dsaserve
