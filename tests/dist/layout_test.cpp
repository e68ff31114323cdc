// The groups of real layouts (SGLang's parallel_state arithmetic) and the flag errors.
#include "dist/layout.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace dsaserve::dist {
namespace {

using R = std::vector<int64_t>;

TEST(ParallelLayout, Tp8Ep8Dp8) {  // the article's deployment: attention DP 8, experts over 8 ranks
  const ParallelLayout l{8, 8, 8};
  l.validate();
  EXPECT_EQ(l.attn_tp(), 1);
  EXPECT_EQ(l.moe_tp(), 1);
  EXPECT_EQ(l.dense_tp(), 8);
  for (int64_t r = 0; r < 8; ++r) {
    EXPECT_EQ(l.group(GroupKind::attn_tp, r).ranks, R{r});
    EXPECT_EQ(l.group(GroupKind::attn_dp, r).ranks, (R{0, 1, 2, 3, 4, 5, 6, 7}));
    EXPECT_EQ(l.group(GroupKind::attn_dp, r).rank, r);
    EXPECT_EQ(l.group(GroupKind::ep, r).ranks, (R{0, 1, 2, 3, 4, 5, 6, 7}));
    EXPECT_EQ(l.group(GroupKind::ep, r).rank, r);
    EXPECT_EQ(l.group(GroupKind::moe_tp, r).ranks, R{r});
    EXPECT_EQ(l.group(GroupKind::world, r).size(), 8);
    EXPECT_EQ(l.attn_dp_rank(r), r);
    EXPECT_EQ(l.ep_rank(r), r);
  }
  EXPECT_EQ(l.groups(GroupKind::attn_tp).size(), 8u);
  EXPECT_EQ(l.groups(GroupKind::ep).size(), 1u);
}

TEST(ParallelLayout, Tp8Ep8Dp1) {  // attention TP over all 8, experts by EP
  const ParallelLayout l{8, 8, 1};
  l.validate();
  EXPECT_EQ(l.attn_tp(), 8);
  EXPECT_EQ(l.group(GroupKind::attn_tp, 5).ranks, (R{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(l.group(GroupKind::attn_tp, 5).rank, 5);
  EXPECT_EQ(l.group(GroupKind::attn_dp, 5).ranks, R{5});
  EXPECT_EQ(l.groups(GroupKind::attn_dp).size(), 8u);
  EXPECT_EQ(l.group(GroupKind::ep, 5).ranks, (R{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(l.group(GroupKind::moe_tp, 5).ranks, R{5});
}

TEST(ParallelLayout, Tp2Ep2Dp2) {
  const ParallelLayout l{2, 2, 2};
  l.validate();
  EXPECT_EQ(l.group(GroupKind::attn_tp, 1).ranks, R{1});
  EXPECT_EQ(l.group(GroupKind::attn_tp, 1).index, 1);
  EXPECT_EQ(l.group(GroupKind::attn_dp, 1).ranks, (R{0, 1}));
  EXPECT_EQ(l.group(GroupKind::ep, 1).ranks, (R{0, 1}));
  EXPECT_EQ(l.group(GroupKind::moe_tp, 0).ranks, R{0});
}

TEST(ParallelLayout, Tp4Ep1Dp1) {  // pure TP: every group but the one-rank ones is the world
  const ParallelLayout l{4, 1, 1};
  l.validate();
  EXPECT_EQ(l.moe_tp(), 4);
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(l.group(GroupKind::attn_tp, r).ranks, (R{0, 1, 2, 3}));
    EXPECT_EQ(l.group(GroupKind::moe_tp, r).ranks, (R{0, 1, 2, 3}));
    EXPECT_EQ(l.group(GroupKind::moe_tp, r).rank, r);
    EXPECT_EQ(l.group(GroupKind::ep, r).ranks, R{r});
    EXPECT_EQ(l.group(GroupKind::attn_dp, r).ranks, R{r});
    EXPECT_EQ(l.group(GroupKind::dense_tp, r).ranks, (R{0, 1, 2, 3}));
  }
  EXPECT_EQ((ParallelLayout{4, 1, 1, 1}).group(GroupKind::dense_tp, 2).ranks, R{2});
}

TEST(ParallelLayout, MixedLayoutStridesEp) {  // tp 8, ep 4: MoE TP pairs, EP strided by 2
  const ParallelLayout l{8, 4, 2};
  l.validate();
  EXPECT_EQ(l.group(GroupKind::moe_tp, 5).ranks, (R{4, 5}));
  EXPECT_EQ(l.group(GroupKind::ep, 5).ranks, (R{1, 3, 5, 7}));
  EXPECT_EQ(l.group(GroupKind::ep, 5).rank, 2);
  EXPECT_EQ(l.group(GroupKind::attn_tp, 5).ranks, (R{4, 5, 6, 7}));
  EXPECT_EQ(l.group(GroupKind::attn_dp, 5).ranks, (R{1, 5}));
  // Every kind partitions the ranks.
  for (GroupKind k : kAllGroups) {
    std::vector<int> seen(8, 0);
    for (const Group& g : l.groups(k))
      for (int64_t r : g.ranks) ++seen[size_t(r)];
    EXPECT_EQ(seen, std::vector<int>(8, 1)) << to_string(k);
  }
}

std::string error_of(const ParallelLayout& l) {
  try {
    l.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ParallelLayout, ErrorsNameTheFlag) {
  EXPECT_NE(error_of({8, 3, 1}).find("--tp 8 is not divisible by --ep-size 3"), std::string::npos);
  EXPECT_NE(error_of({8, 1, 3}).find("--attn-dp-size 3"), std::string::npos);
  EXPECT_NE(error_of({0, 1, 1}).find("--tp must be >= 1"), std::string::npos);
  EXPECT_NE(error_of({4, 1, 1, 2}).find("--moe-dense-tp-size"), std::string::npos);
  EXPECT_THROW((ParallelLayout{2, 1, 1}).group(GroupKind::world, 2), Error);
}

}  // namespace
}  // namespace dsaserve::dist
