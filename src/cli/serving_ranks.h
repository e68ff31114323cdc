#pragma once
// The ranks of the commands that serve (serve, generate) with --tp N (cli/dist_flags.h): N processes on
// the CPU (Gloo), or one per GPU with --device cuda (NCCL; the launcher gives each rank one GPU through
// CUDA_VISIBLE_DEVICES). Rank 0 runs the engine (and serve's HTTP front) and leads; the others follow its
// steps (runtime/ranks/leader.h).
#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>

#include "cli/dist_flags.h"
#include "core/tensor.h"
#include "model/load.h"
#include "runtime/ranks/ranks.h"

namespace dsaserve::cli {

struct ServingRankFlags {
  bool launch_one = false;          // --dist-launch: the launched-rank path even for --tp 1
  bool dsa_topk_broadcast = false;  // --dsa-topk-broadcast
  // --load-balance-method (attention DP: how the front routes requests to the DP groups).
  std::string load_balance_method = "round_robin";
};

std::shared_ptr<ServingRankFlags> add_serving_rank_flags(CLI::App& sub);

// Before any rank starts (one-line errors naming the flag): --attn-dp-size > 1 on the CPU only, no
// speculative decoding, a model that splits over the layout (skipped for the built-in model), and on CUDA
// a GPU per rank of this machine.
void check_serving_ranks(const DistFlags& f, const ServingRankFlags& r, const char* command, Device device,
                         const model::LoadSpec& model, bool builtin, bool speculative);

// In the process the user started, with --tp > 1 (or --dist-launch): runs this machine's ranks and
// returns their exit status; `front`: SIGTERM / SIGINT go to rank 0 alone (serve). Otherwise nullopt.
std::optional<int> launch_serving_ranks(const DistFlags& f, const ServingRankFlags& r, Device device,
                                        bool front);

// A launched rank's connections (null for a single process). Unless `threads` > 0 the machine's CPU
// threads are split over its ranks.
std::shared_ptr<runtime::Ranks> connect_serving_rank(const DistFlags& f, Device device, int threads);

}  // namespace dsaserve::cli
