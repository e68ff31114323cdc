// End-to-end: runs the real dsaserve binary.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/fixtures.h"

namespace dsaserve {
namespace {

using testing::dsaserve_binary;
using testing::run_command;

TEST(InspectCli, Glm53ConfigJson) {
  DSA_FIXTURE_PATH(cfg, "configs/glm-5.3.json");
  std::string out;
  ASSERT_EQ(run_command(
                fmt::format("{} inspect --config {} --json", dsaserve_binary().string(), cfg.string()), &out),
            0)
      << out;
  const auto j = nlohmann::json::parse(out);
  const double total = j["params"]["total"].get<double>(), active = j["params"]["active"].get<double>();
  EXPECT_NEAR(total / 743e9, 1.0, 0.01);
  EXPECT_NEAR(active / 41e9, 1.0, 0.01);
  EXPECT_EQ(j["indexer"]["full_layers"], 21);
  EXPECT_EQ(j["kv_cache_values_per_token"], 44928);
  EXPECT_EQ(j["layers"].size(), 78u);
}

TEST(InspectCli, CheckpointsBindAndReportBytes) {
  DSA_FIXTURE_PATH(models, "models");
  for (const char* name : {"tiny", "realdims", "realdims_fp8"}) {
    std::string out;
    ASSERT_EQ(run_command(fmt::format("{} inspect --model {} --json", dsaserve_binary().string(),
                                      (models / name).string()),
                          &out),
              0)
        << out;
    const auto j = nlohmann::json::parse(out);
    EXPECT_EQ(j["binding"].get<std::string>().rfind("ok", 0), 0u) << name;
    EXPECT_GT(j["checkpoint"]["bytes_by_dtype"]["BF16"].get<int64_t>(), 0) << name;
  }
}

TEST(InspectCli, BadInputGivesOneLineErrorAndNonZeroExit) {
  DSA_FIXTURE_PATH(tiny, "models/tiny");
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("dsaserve_cli_bad_{}", ::getpid());
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(tiny / "config.json", dir / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  {
    std::ifstream in(tiny / "model.safetensors", std::ios::binary);
    std::string head(4096, '\0');
    in.read(head.data(), 4096);
    std::ofstream(dir / "model.safetensors", std::ios::binary).write(head.data(), 4096);
  }
  std::ofstream(dir / "bad.json") << R"({"model_type": "glm_moe_dsa", "n_group": 3})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {fmt::format("inspect --model {}", dir.string()), "truncated"},
      {fmt::format("inspect --config {}", (dir / "bad.json").string()), "n_group"},
      {"inspect --config /nonexistent.json", "cannot open"},
  };
  for (const auto& [args, expect] : cases) {
    std::string out;
    EXPECT_NE(run_command(dsaserve_binary().string() + " " + args, &out), 0) << args;
    EXPECT_NE(out.find(expect), std::string::npos) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dsaserve
