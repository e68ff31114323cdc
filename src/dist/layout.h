#pragma once
// The parallel layout of a deployment: SGLang's --tp, --ep-size, --attn-dp-size and --moe-dense-tp-size,
// and the process groups they imply. plan::Deployment prices a layout; the ranks run it (dist/).
//
// Ranks 0..tp-1 (--tp counts every GPU / CPU process of the deployment, over all nodes). The groups, as
// SGLang's parallel_state builds them:
//   world      every rank
//   attn_tp    attention TP: tp / attn_dp_size consecutive ranks (attention heads split over them)
//   attn_dp    attention DP: the ranks with the same attention-TP rank, one per DP replica
//   moe_tp     MoE TP: tp / ep_size consecutive ranks (each expert's intermediate split over them)
//   ep         expert parallel: the ranks with the same MoE-TP rank, strided by tp / ep_size
//   dense_tp   the dense MLPs' TP group: every rank (--moe-dense-tp-size tp) or the rank alone (1)
#include <cstdint>
#include <string>
#include <vector>

namespace dsaserve::dist {

enum class GroupKind : uint8_t { world, attn_tp, attn_dp, moe_tp, ep, dense_tp };
const char* to_string(GroupKind g);  // "world", "attn_tp", "attn_dp", "moe_tp", "ep", "dense_tp"
inline constexpr GroupKind kAllGroups[] = {GroupKind::world,  GroupKind::attn_tp, GroupKind::attn_dp,
                                           GroupKind::moe_tp, GroupKind::ep,      GroupKind::dense_tp};

// One group as one rank sees it.
struct Group {
  GroupKind kind = GroupKind::world;
  int64_t index = 0;           // which group of this kind (0 .. tp / size - 1)
  std::vector<int64_t> ranks;  // global ranks, ascending
  int64_t rank = 0;            // this rank's position in `ranks`
  int64_t size() const { return int64_t(ranks.size()); }
};

struct ParallelLayout {
  int64_t tp = 1;                 // --tp: ranks in all
  int64_t ep_size = 1;            // --ep-size
  int64_t attn_dp_size = 1;       // --attn-dp-size
  int64_t moe_dense_tp_size = 0;  // --moe-dense-tp-size: 1 (dense MLPs replicated) or tp; 0 means tp

  bool operator==(const ParallelLayout&) const = default;
  int64_t world_size() const { return tp; }
  int64_t attn_tp() const { return tp / attn_dp_size; }
  int64_t moe_tp() const { return tp / ep_size; }
  int64_t dense_tp() const { return moe_dense_tp_size == 0 ? tp : moe_dense_tp_size; }

  // Ranks within their groups (SGLang: attn_tp_rank = tp_rank % attn_tp, attn_dp_rank = tp_rank / attn_tp,
  // moe_tp_rank = tp_rank % moe_tp, moe_ep_rank = tp_rank / moe_tp).
  int64_t attn_tp_rank(int64_t rank) const { return rank % attn_tp(); }
  int64_t attn_dp_rank(int64_t rank) const { return rank / attn_tp(); }
  int64_t moe_tp_rank(int64_t rank) const { return rank % moe_tp(); }
  int64_t ep_rank(int64_t rank) const { return rank / moe_tp(); }

  // Throws dsaserve::Error naming the flag at fault: sizes >= 1, tp divisible by ep_size and attn_dp_size,
  // moe_dense_tp_size 0, 1 or tp.
  void validate() const;
  // The group of `kind` that holds `rank` (0 <= rank < tp; validate() first).
  Group group(GroupKind kind, int64_t rank) const;
  // Every group of `kind`, by index.
  std::vector<Group> groups(GroupKind kind) const;
  std::string describe() const;  // "tp 8, ep 8, attn dp 8 (attn tp 1, moe tp 1, dense tp 8)"
};

}  // namespace dsaserve::dist
