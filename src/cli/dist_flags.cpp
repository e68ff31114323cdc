#include "cli/dist_flags.h"

#include <fstream>
#include <iterator>

#include "core/error.h"

namespace dsaserve::cli {

namespace {

// This process's command line, argv[1..] (/proc/self/cmdline: NUL-separated).
std::vector<std::string> own_arguments() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  size_t p = 0;
  while (p < all.size()) {
    const size_t e = all.find('\0', p);
    args.push_back(all.substr(p, e == std::string::npos ? std::string::npos : e - p));
    if (e == std::string::npos) break;
    p = e + 1;
  }
  DSA_CHECK(!args.empty(), "launcher: cannot read /proc/self/cmdline");
  args.erase(args.begin());
  return args;
}

}  // namespace

std::shared_ptr<DistFlags> add_dist_flags(CLI::App& sub) {
  auto f = std::make_shared<DistFlags>();
  sub.add_option("--tp,--tp-size,--tensor-parallel-size", f->layout.tp,
                 "ranks in all (SGLang --tp): processes on this machine, one per GPU with --device cuda")
      ->capture_default_str();
  sub.add_option("--ep-size,--expert-parallel-size", f->layout.ep_size, "expert parallel size")
      ->capture_default_str();
  sub.add_option("--attn-dp-size", f->layout.attn_dp_size,
                 "attention data parallel size (attention TP = --tp / it)")
      ->capture_default_str();
  sub.add_option("--moe-dense-tp-size", f->layout.moe_dense_tp_size,
                 "dense MLP TP size: 1 (replicated) or --tp");
  sub.add_option("--moe-a2a-backend", f->moe_a2a_backend,
                 "MoE all-to-all: none (each rank's experts on every row, then an all-reduce) or deepep "
                 "(dispatch each row to its experts' ranks and combine back; needs --ep-size = --tp)")
      ->check(CLI::IsMember({"none", "deepep"}))
      ->capture_default_str();
  sub.add_flag("--deepep-bf16-dispatch", f->deepep_bf16_dispatch,
               "deepep: dispatch the rows unquantised (SGLang's SGLANG_DEEPEP_BF16_DISPATCH; f32 on the CPU) "
               "and combine them as held; default: FP8 dispatch (e4m3, a scale per 128 columns) and bf16 "
               "combine where the routed experts are FP8 block-scaled");
  sub.add_option("--nnodes", f->launch.nnodes, "machines in the deployment")->capture_default_str();
  sub.add_option("--node-rank", f->launch.node_rank, "this machine's index")->capture_default_str();
  sub.add_option("--dist-init-addr", f->launch.dist_init_addr,
                 "HOST:PORT of the rendezvous store (node 0 hosts it; default: 127.0.0.1 on a free port)");
  sub.add_option("--dist-timeout", f->timeout_s,
                 "seconds a rank waits for a peer in a collective or at start-up before it fails")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  // Set by the launcher on each rank's command line.
  sub.add_option("--dist-rank", f->rank.rank)->group("");
  sub.add_option("--dist-store", f->rank.store)->group("");
  return f;
}

void DistFlags::check(const char* command) const {
  DSA_CHECK(!deepep() || layout.tp > 1,
            "{}: --moe-a2a-backend deepep runs with --ep-size = --tp > 1 (its dispatch / combine move tokens "
            "between the expert ranks); got --tp 1",
            command);
}

std::optional<int> launch_if_needed(const DistFlags& f) {
  dist::LaunchSpec spec = f.launch;
  spec.world_size = f.layout.tp;
  return launch_if_needed(f, spec, false);
}

std::optional<int> launch_if_needed(const DistFlags& f, const dist::LaunchSpec& spec, bool always) {
  f.layout.validate();
  DSA_CHECK(!f.deepep() || f.layout.ep_size == f.layout.tp,
            "--moe-a2a-backend deepep runs with --ep-size = --tp ({}) so far (got --ep-size {})", f.layout.tp,
            f.layout.ep_size);
  if (!(f.multi_rank() || always) || f.rank.launched()) return std::nullopt;
  return dist::launch_ranks("/proc/self/exe", own_arguments(), spec);
}

std::unique_ptr<dist::ProcessGroups> connect_rank(const DistFlags& f) {
  if (!f.rank.launched()) return nullptr;
  dist::GlooOptions opt;
  opt.timeout = std::chrono::seconds(f.timeout_s);
  if (f.launch.nnodes > 1) opt.host = "";  // Gloo listens on this machine's hostname address
  return dist::connect_gloo_ranks(f.layout, f.rank, opt);
}

}  // namespace dsaserve::cli
