// End-to-end: `dsaserve generate` (the real binary): greedy continuations equal the goldens exactly;
// seeded sampling is reproducible; bad prompts are clear errors.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/fixtures.h"

namespace dsaserve {
namespace {

using testing::dsaserve_binary;
using testing::run_command;

nlohmann::json run_json(const std::string& args) {
  std::string out;
  EXPECT_EQ(run_command(fmt::format("{} generate {}", dsaserve_binary().string(), args), &out), 0) << out;
  return nlohmann::json::parse(out.substr(out.find('{')));
}

TEST(GenerateCli, GreedyMatchesGoldens) {
  DSA_FIXTURE_PATH(models, "models");
  for (const char* name : {"tiny", "realdims_fp8"}) {
    const auto gold = models / name / "goldens.safetensors";
    for (int j = 0; j < 2; ++j) {
      const auto prompt = testing::read_safetensors_i32(gold, fmt::format("greedy{}.prompt", j));
      const auto expect = testing::read_safetensors_i32(gold, fmt::format("greedy{}.output", j));
      const auto res = run_json(fmt::format("--model {} --prompt-ids {} --max-new-tokens {}",
                                            (models / name).string(), fmt::join(prompt, ","), expect.size()));
      EXPECT_EQ(res["output_ids"].get<std::vector<int32_t>>(), expect) << name << " greedy" << j;
      EXPECT_EQ(res["sampling"], "greedy");
    }
  }
}

TEST(GenerateCli, SeededSamplingIsReproducibleAndBadInputFails) {
  DSA_FIXTURE_PATH(tiny, "models/tiny");
  const std::string base = fmt::format("--model {} --prompt-ids 5,6,7 --max-new-tokens 8", tiny.string());
  const auto a = run_json(base + " --temperature 0.8 --top-k 50 --seed 3");
  const auto b = run_json(base + " --temperature 0.8 --top-k 50 --seed 3");
  EXPECT_EQ(a["output_ids"], b["output_ids"]);
  EXPECT_EQ(a["output_ids"].size(), 8u);
  EXPECT_EQ(a["sampling"], "sample");
  std::string msg;
  EXPECT_NE(run_command(fmt::format("{} generate --model {} --prompt-ids 1,600", dsaserve_binary().string(),
                                    tiny.string()),
                        &msg),
            0);
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
  EXPECT_NE(run_command(fmt::format("{} generate --model {} --prompt-ids ,", dsaserve_binary().string(),
                                    tiny.string()),
                        &msg),
            0);
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;
}

// issue 17: `generate --speculative-*` gives the greedy ids of plain generate, token for token, and its JSON
// carries the accept statistics; seeded sampled requests speculate and reproduce; bad flags name themselves.
TEST(GenerateCli, SpeculativeGreedyEqualsPlain) {
  DSA_FIXTURE_PATH(models, "models");
  for (const char* name : {"tiny", "realdims", "realdims_fp8"}) {
    const auto gold = models / name / "goldens.safetensors";
    const auto prompt = testing::read_safetensors_i32(gold, "greedy0.prompt");
    const std::string base = fmt::format("--model {} --prompt-ids {} --max-new-tokens 20",
                                         (models / name).string(), fmt::join(prompt, ","));
    const auto plain = run_json(base);
    for (int steps : {1, 3, 5}) {
      const auto spec =
          run_json(base + fmt::format(" --speculative-algorithm {} --speculative-num-steps {} "
                                      "--speculative-eagle-topk 1 --speculative-num-draft-tokens {}",
                                      steps == 3 ? "NEXTN" : "EAGLE", steps, steps + 1));
      EXPECT_EQ(spec["output_ids"], plain["output_ids"]) << name << " steps " << steps;
      const auto& st = spec["speculative"];
      EXPECT_TRUE(st["used"].get<bool>());
      EXPECT_GT(st["rounds"].get<int64_t>(), 0);
      EXPECT_EQ(st["drafted_tokens"].get<int64_t>(), st["rounds"].get<int64_t>() * steps);
      EXPECT_GE(st["accept_length_mean"].get<double>(), 1.0);
      EXPECT_EQ(st["accept_length_histogram"].size(), size_t(steps + 2));
    }
  }
  DSA_FIXTURE_PATH(tiny, "models/tiny");
  const std::string base = fmt::format("--model {} --prompt-ids 5,6,7 --max-new-tokens 8", tiny.string());
  const auto sampled = run_json(base + " --temperature 0.8 --seed 3");
  const auto sampled_spec =
      run_json(base + " --temperature 0.8 --seed 3 --speculative-algorithm EAGLE --speculative-num-steps 3");
  // Sampled: speculative sampling (same distribution, other draws): seeded runs reproduce.
  EXPECT_TRUE(sampled_spec["speculative"]["used"].get<bool>());
  EXPECT_GT(sampled_spec["speculative"]["rounds"].get<int64_t>(), 0);
  EXPECT_EQ(sampled_spec["output_ids"].size(), sampled["output_ids"].size());
  EXPECT_EQ(
      run_json(base + " --temperature 0.8 --seed 3 --speculative-algorithm EAGLE --speculative-num-steps 3")
          ["output_ids"],
      sampled_spec["output_ids"]);
  const std::string bin = dsaserve_binary().string() + " generate " + base;
  for (const auto& [flags, named] : std::vector<std::pair<std::string, std::string>>{
           {"--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 4",
            "--speculative-eagle-topk"},
           {"--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-num-draft-tokens 8",
            "--speculative-num-draft-tokens"},
           {"--speculative-algorithm MEDUSA --speculative-num-steps 3", "--speculative-algorithm"},
           {"--speculative-algorithm EAGLE", "--speculative-num-steps"},
           {"--speculative-num-steps 3", "--speculative-algorithm"}}) {
    std::string msg;
    EXPECT_NE(run_command(bin + " " + flags, &msg), 0) << flags;
    EXPECT_NE(msg.find(named), std::string::npos) << flags << ": " << msg;
  }
}

}  // namespace
}  // namespace dsaserve
