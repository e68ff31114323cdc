#pragma once
// The Gloo backend: collectives of CPU tensors over Gloo's TCP transport (the library PyTorch uses for
// CPU process groups), rendezvous through a dist::Store.
#include <chrono>
#include <memory>
#include <string>

#include "dist/communicator.h"
#include "dist/store.h"

namespace dsaserve::dist {

struct GlooOptions {
  // The address this rank's transport listens on; empty: its hostname's (several machines).
  std::string host = "127.0.0.1";
  // A collective that has not completed by then (a peer hung or died) throws.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// Collective over the group's ranks: every member calls it with the same `prefix` (unique per group, e.g.
// "attn_tp/1"), its rank in the group and the group size. Size 1 needs no store traffic.
std::unique_ptr<Communicator> make_gloo_communicator(Store& store, const std::string& prefix,
                                                     std::string group, int64_t rank, int64_t size,
                                                     const GlooOptions& opt);

}  // namespace dsaserve::dist
