#include "dist/process_groups.h"

#include <fmt/format.h>

namespace dsaserve::dist {

ProcessGroups::ProcessGroups(const ParallelLayout& layout, int64_t rank, const CommunicatorFactory& make)
    : layout_(layout), rank_(rank) {
  layout_.validate();
  // Every rank walks the kinds in the same order, so each group's members rendezvous together.
  for (GroupKind k : kAllGroups) {
    Group g = layout_.group(k, rank);
    comms_[size_t(k)] = make(fmt::format("{}/{}", to_string(k), g.index), to_string(k), g.rank, g.size());
    groups_[size_t(k)] = std::move(g);
  }
}

}  // namespace dsaserve::dist
