#include "runtime/ranks/ranks.h"

#include <fmt/format.h>

#include "core/error.h"
#include "dist/gloo_communicator.h"

#ifdef DSASERVE_HAVE_CUDA
#include "dist/nccl_communicator.h"
#include "kernels/cuda/common/device_context.h"
#include "kernels/cuda/common/runtime.h"
#include "kernels/cuda/common/views.h"
#endif

namespace dsaserve::runtime {

Ranks::Ranks(const dist::ParallelLayout& layout, const dist::RankArgs& args, const RanksOptions& opt)
    : timeout_(opt.timeout) {
  DSA_CHECK(args.launched(), "ranks: not a launched rank (no --dist-rank)");
  layout.validate();
  DSA_CHECK(args.rank < layout.world_size(), "ranks: --dist-rank {} of a layout of {} ranks", args.rank,
            layout.world_size());
  const auto [host, port] = dist::parse_host_port(args.store, "--dist-store");
  store_ = std::make_shared<dist::TcpStore>(host, port, opt.timeout);
  dist::Store& s = *store_;
  dist::GlooOptions gloo;
  gloo.host = opt.host;
  gloo.timeout = opt.timeout;
  dist::CommunicatorFactory make;
  if (opt.device == Device::cpu) {
    make = [&](const std::string& prefix, const std::string& group, int64_t rank, int64_t size) {
      return dist::make_gloo_communicator(s, prefix, group, rank, size, gloo);
    };
  } else {
#ifdef DSASERVE_HAVE_CUDA
    // Each rank sees its one GPU as device 0 (the launcher's CUDA_VISIBLE_DEVICES). The collectives run on
    // that device context's comm stream, ordered with the operators' stream by events (op_stream, read at
    // each call: the compute stream, or the capturing stream inside a CUDA-graph capture, which the comm
    // stream then joins), so a collective sees the inputs the operators before it wrote and the operators
    // after it see its outputs.
    const dist::NcclStreams streams{kernels::cuda::device_context().comm, &kernels::cuda::op_stream};
    make = [&, streams](const std::string& prefix, const std::string& group, int64_t rank, int64_t size) {
      return dist::make_nccl_communicator(s, prefix, group, rank, size, streams, opt.timeout);
    };
#else
    fail("--device cuda --tp {}: this dsaserve was built without CUDA (no NCCL)", layout.tp);
#endif
  }
  groups_ = std::make_unique<dist::ProcessGroups>(layout, args.rank, make);
  // The steps' channel: a group of its own over this rank's attention-TP group (the world without
  // attention DP; never interleaved with the model's collectives).
  const int64_t atp = layout.attn_tp(), dp = layout.attn_dp_rank(args.rank);
  control_ = dist::make_gloo_communicator(s, fmt::format("control/{}", dp), "control",
                                          layout.attn_tp_rank(args.rank), atp, gloo);
  if (layout.attn_dp_size > 1 && layout.attn_tp_rank(args.rank) == 0) {
    dp_control_ =
        dist::make_gloo_communicator(s, "dp_control/0", "dp_control", dp, layout.attn_dp_size, gloo);
  }
}

dist::Communicator& Ranks::dp_control() const {
  DSA_CHECK(dp_control_ != nullptr, "ranks: rank {} is not a DP group's leader (no dp_control group)",
            rank());
  return *dp_control_;
}

Ranks::~Ranks() = default;

int64_t visible_cuda_devices() {
#ifdef DSASERVE_HAVE_CUDA
  return kernels::cuda::device_count();
#else
  return 0;
#endif
}

}  // namespace dsaserve::runtime
