#include "cli/serving_ranks.h"

#include <cstdlib>
#include <sstream>

#include "core/error.h"
#include "core/parallel.h"
#include "model/shard.h"

namespace dsaserve::cli {

std::shared_ptr<ServingRankFlags> add_serving_rank_flags(CLI::App& sub) {
  auto r = std::make_shared<ServingRankFlags>();
  sub.add_flag("--dist-launch", r->launch_one,
               "run as launched ranks even with --tp 1 (the many-rank code path with one rank)");
  sub.add_flag("--dsa-topk-broadcast", r->dsa_topk_broadcast,
               "with --tp: attention TP ranks take rank 0's DSA top-k indices (SGLANG_DSA_TOPK_BROADCAST)");
  sub.add_option("--load-balance-method", r->load_balance_method,
                 "with --attn-dp-size > 1: how the front routes requests to the DP groups: round_robin, or "
                 "shortest_queue (the group with the fewest unfinished requests)")
      ->check(CLI::IsMember({"round_robin", "shortest_queue"}))
      ->capture_default_str();
  return r;
}

namespace {

bool ranked(const DistFlags& f, const ServingRankFlags& r) { return f.multi_rank() || r.launch_one; }

// The GPUs the ranks of this machine get, one each: CUDA_VISIBLE_DEVICES's entries when set, else 0..n-1.
std::vector<std::string> rank_gpus(int64_t ranks, int64_t visible) {
  std::vector<std::string> ids;
  if (const char* e = std::getenv("CUDA_VISIBLE_DEVICES"); e != nullptr && *e != '\0') {
    std::stringstream ss(e);
    for (std::string id; std::getline(ss, id, ',');) ids.push_back(id);
  } else {
    for (int64_t i = 0; i < visible; ++i) ids.push_back(std::to_string(i));
  }
  ids.resize(size_t(std::min<int64_t>(ranks, int64_t(ids.size()))));
  return ids;
}

}  // namespace

void check_serving_ranks(const DistFlags& f, const ServingRankFlags& r, const char* command, Device device,
                         const model::LoadSpec& model, bool builtin, bool speculative) {
  f.layout.validate();
  f.check(command);
  if (!ranked(f, r)) return;
  DSA_CHECK(!f.deepep() || device == Device::cpu,
            "{}: --device cuda --moe-a2a-backend deepep is not run yet: its dispatch / combine move host "
            "tensors over Gloo (model/deepep.h), a GPU rank's groups are NCCL's (GPUs: issue 16); use "
            "--moe-a2a-backend none",
            command);
  DSA_CHECK(f.layout.attn_dp_size == 1 || device == Device::cpu,
            "{}: --device cuda --attn-dp-size {} is not run yet (attention DP serves on CPU ranks; GPUs: "
            "issue 16); use --attn-dp-size 1",
            command, f.layout.attn_dp_size);
  DSA_CHECK(!speculative,
            "{}: --speculative-algorithm with --tp {} is not run yet (speculative decoding runs on one rank)",
            command, f.layout.tp);
  if (!builtin) model::Shard{f.layout, 0}.validate(model::load_config(model));
  if (device == Device::cuda && !f.rank.launched()) {
    const int64_t need = f.layout.tp / f.launch.nnodes, have = runtime::visible_cuda_devices();
    DSA_CHECK(
        have >= need,
        "{}: --device cuda --tp {} runs one rank per GPU: {} rank(s) on this machine, {} GPU(s) visible",
        command, f.layout.tp, need, have);
  }
}

std::optional<int> launch_serving_ranks(const DistFlags& f, const ServingRankFlags& r, Device device,
                                        bool front) {
  if (!ranked(f, r) || f.rank.launched()) return std::nullopt;
  dist::LaunchSpec spec = f.launch;
  spec.world_size = f.layout.tp;
  if (front) spec.front_rank = 0;
  if (device == Device::cuda) {
    const int64_t n = spec.world_size / spec.nnodes;
    const std::vector<std::string> gpus = rank_gpus(n, runtime::visible_cuda_devices());
    DSA_CHECK(int64_t(gpus.size()) == n, "--device cuda --tp {}: {} rank(s) on this machine, {} GPU(s)",
              f.layout.tp, n, gpus.size());
    for (const std::string& g : gpus) spec.rank_env.push_back({"CUDA_VISIBLE_DEVICES=" + g});
  }
  return launch_if_needed(f, spec, true);
}

std::shared_ptr<runtime::Ranks> connect_serving_rank(const DistFlags& f, Device device, int threads) {
  if (!f.rank.launched()) return nullptr;
  runtime::RanksOptions opt;
  opt.device = device;
  opt.timeout = std::chrono::seconds(f.timeout_s);
  if (f.launch.nnodes > 1) opt.host = "";  // Gloo listens on this machine's hostname address
  auto ranks = std::make_shared<runtime::Ranks>(f.layout, f.rank, opt);
  if (threads <= 0) set_num_threads(std::max(1, num_threads() / int(f.layout.tp / f.launch.nnodes)));
  return ranks;
}

}  // namespace dsaserve::cli
