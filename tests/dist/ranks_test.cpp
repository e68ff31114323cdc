// Ranks as real processes (dist/launcher.h) over Gloo: rank_probe launches N copies of itself that check
// every collective of every group; a rank that dies or hangs ends the run with an error in bounded time.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>

#include "common/fixtures.h"

namespace dsaserve::dist {
namespace {

using testing::run_command;

struct ProbeRun {
  int status = 0;
  std::string output;
  double seconds = 0;
};

ProbeRun probe(const std::string& args) {
  ProbeRun r;
  const auto t0 = std::chrono::steady_clock::now();
  r.status = run_command(fmt::format("timeout 60 {} {}", DSASERVE_RANK_PROBE, args), &r.output);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(RankProcesses, EveryCollectiveOnTwoRanks) {
  const ProbeRun r = probe("--tp 2");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(count(r.output, " ok"), 2) << r.output;
}

TEST(RankProcesses, EveryCollectiveOnFourRanksEveryGroup) {
  for (const char* layout :
       {"--tp 4", "--tp 4 --ep-size 2 --attn-dp-size 2", "--tp 4 --ep-size 4 --attn-dp-size 4"}) {
    const ProbeRun r = probe(layout);
    EXPECT_EQ(r.status, 0) << layout << "\n" << r.output;
    EXPECT_EQ(count(r.output, " ok"), 4) << layout << "\n" << r.output;
  }
}

TEST(RankProcesses, AKilledRankEndsTheOthersWithAnError) {
  const ProbeRun r = probe("--tp 4 --die-rank 2 --dist-timeout 20");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("rank 2 was killed by signal 9"), std::string::npos) << r.output;
  EXPECT_EQ(count(r.output, " ok"), 0) << r.output;
  EXPECT_LT(r.seconds, 15) << r.output;  // well inside the collective timeout: the launcher ended them
}

TEST(RankProcesses, AHungRankEndsTheRunThroughItsPeersTimeout) {
  const ProbeRun r = probe("--tp 2 --hang-rank 1 --dist-timeout 2");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("error: rank 0"), std::string::npos) << r.output;  // its all_reduce timed out
  EXPECT_NE(r.output.find("launcher: rank 0 of 2 exited with status 1"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 20) << r.output;  // 2 s timeout + 3 s grace, never the hang's hour
}

}  // namespace
}  // namespace dsaserve::dist
