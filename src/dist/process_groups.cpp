#include "dist/process_groups.h"

#include <fmt/format.h>

#include "core/error.h"

namespace dsaserve::dist {

ProcessGroups::ProcessGroups(const ParallelLayout& layout, int64_t rank, const CommunicatorFactory& make,
                             std::shared_ptr<Store> store)
    : layout_(layout), rank_(rank), store_(std::move(store)) {
  layout_.validate();
  // Every rank walks the kinds in the same order, so each group's members rendezvous together.
  for (GroupKind k : kAllGroups) {
    Group g = layout_.group(k, rank);
    comms_[size_t(k)] = make(fmt::format("{}/{}", to_string(k), g.index), to_string(k), g.rank, g.size());
    groups_[size_t(k)] = std::move(g);
  }
}

std::unique_ptr<ProcessGroups> connect_gloo_ranks(const ParallelLayout& layout, const RankArgs& args,
                                                  const GlooOptions& opt) {
  DSA_CHECK(args.launched(), "dist: not a launched rank (no --dist-rank)");
  layout.validate();
  DSA_CHECK(args.rank < layout.world_size(), "dist: --dist-rank {} of a layout of {} ranks", args.rank,
            layout.world_size());
  const auto [host, port] = parse_host_port(args.store, "--dist-store");
  auto store = std::make_shared<TcpStore>(host, port, opt.timeout);
  Store& s = *store;
  return std::make_unique<ProcessGroups>(
      layout, args.rank,
      [&](const std::string& prefix, const std::string& group, int64_t rank, int64_t size) {
        return make_gloo_communicator(s, prefix, group, rank, size, opt);
      },
      std::move(store));
}

}  // namespace dsaserve::dist
