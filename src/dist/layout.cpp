// Group arithmetic of a ParallelLayout (SGLang's parallel_state.initialize_model_parallel).
#include "dist/layout.h"

#include <fmt/format.h>

#include "core/error.h"

namespace dsaserve::dist {

const char* to_string(GroupKind g) {
  switch (g) {
    case GroupKind::world: return "world";
    case GroupKind::attn_tp: return "attn_tp";
    case GroupKind::attn_dp: return "attn_dp";
    case GroupKind::moe_tp: return "moe_tp";
    case GroupKind::ep: return "ep";
    case GroupKind::dense_tp: return "dense_tp";
  }
  return "?";
}

void ParallelLayout::validate() const {
  DSA_CHECK(tp >= 1, "--tp must be >= 1, got {}", tp);
  DSA_CHECK(ep_size >= 1, "--ep-size must be >= 1, got {}", ep_size);
  DSA_CHECK(attn_dp_size >= 1, "--attn-dp-size must be >= 1, got {}", attn_dp_size);
  DSA_CHECK(tp % ep_size == 0, "--tp {} is not divisible by --ep-size {}", tp, ep_size);
  DSA_CHECK(tp % attn_dp_size == 0, "--tp {} is not divisible by --attn-dp-size {}", tp, attn_dp_size);
  DSA_CHECK(moe_dense_tp_size == 0 || moe_dense_tp_size == 1 || moe_dense_tp_size == tp,
            "--moe-dense-tp-size must be 1 or --tp ({}), got {}", tp, moe_dense_tp_size);
}

Group ParallelLayout::group(GroupKind kind, int64_t rank) const {
  DSA_CHECK(rank >= 0 && rank < tp, "rank {} is outside the layout's {} ranks", rank, tp);
  Group g;
  g.kind = kind;
  // Each kind: a block of `size` ranks starting at `first`, `stride` apart.
  int64_t first = 0, size = 1, stride = 1;
  switch (kind) {
    case GroupKind::world: size = tp; break;
    case GroupKind::attn_tp:
      size = attn_tp();
      first = attn_dp_rank(rank) * size;
      g.index = attn_dp_rank(rank);
      break;
    case GroupKind::attn_dp:
      size = attn_dp_size;
      stride = attn_tp();
      first = attn_tp_rank(rank);
      g.index = attn_tp_rank(rank);
      break;
    case GroupKind::moe_tp:
      size = moe_tp();
      first = ep_rank(rank) * size;
      g.index = ep_rank(rank);
      break;
    case GroupKind::ep:
      size = ep_size;
      stride = moe_tp();
      first = moe_tp_rank(rank);
      g.index = moe_tp_rank(rank);
      break;
    case GroupKind::dense_tp:
      if (dense_tp() == 1) {
        first = rank;
        g.index = rank;
      } else {
        size = tp;
      }
      break;
  }
  for (int64_t i = 0; i < size; ++i) g.ranks.push_back(first + i * stride);
  g.rank = (rank - first) / stride;
  return g;
}

std::vector<Group> ParallelLayout::groups(GroupKind kind) const {
  std::vector<Group> out;
  for (int64_t r = 0; r < tp; ++r) {
    Group g = group(kind, r);
    if (g.rank == 0) out.push_back(std::move(g));
  }
  return out;
}

std::string ParallelLayout::describe() const {
  return fmt::format("tp {}, ep {}, attn dp {} (attn tp {}, moe tp {}, dense tp {})", tp, ep_size,
                     attn_dp_size, attn_tp(), moe_tp(), dense_tp());
}

}  // namespace dsaserve::dist
