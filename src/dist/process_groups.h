#pragma once
// One rank's communicators: one per group of its ParallelLayout (dist/layout.h), made together by every
// rank (each group's members rendezvous under the prefix "<kind>/<index>").
#include <array>
#include <functional>
#include <memory>

#include "dist/communicator.h"
#include "dist/gloo_communicator.h"
#include "dist/launcher.h"
#include "dist/layout.h"
#include "dist/store.h"

namespace dsaserve::dist {

// Makes one group's communicator (a backend: make_gloo_communicator, make_nccl_communicator).
using CommunicatorFactory = std::function<std::unique_ptr<Communicator>(
    const std::string& prefix, const std::string& group, int64_t rank, int64_t size)>;

class ProcessGroups {
 public:
  // Collective over every rank of the layout (validated here).
  // `store` (may be null) is kept alive with the groups.
  ProcessGroups(const ParallelLayout& layout, int64_t rank, const CommunicatorFactory& make,
                std::shared_ptr<Store> store = nullptr);
  const ParallelLayout& layout() const { return layout_; }
  int64_t rank() const { return rank_; }
  const Group& group(GroupKind k) const { return groups_[size_t(k)]; }
  Communicator& comm(GroupKind k) const { return *comms_[size_t(k)]; }

 private:
  ParallelLayout layout_;
  int64_t rank_ = 0;
  std::shared_ptr<Store> store_;
  std::array<Group, std::size(kAllGroups)> groups_;
  std::array<std::unique_ptr<Communicator>, std::size(kAllGroups)> comms_;
};

// A launched rank's groups over Gloo (CPU tensors): its store client at args.store, then every group.
// Collective over the layout's ranks; throws dsaserve::Error when the store or a peer is not reached
// within opt.timeout.
std::unique_ptr<ProcessGroups> connect_gloo_ranks(const ParallelLayout& layout, const RankArgs& args,
                                                  const GlooOptions& opt);

}  // namespace dsaserve::dist
