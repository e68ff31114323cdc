// A probe of ranks as processes: `rank_probe --tp N [--ep-size E] [--attn-dp-size D] [--die-rank R]
// [--hang-rank R] [--dist-timeout S]` launches N ranks of itself (dist/launcher.h); each connects its
// groups over Gloo, runs every collective of the world group with known values, checks them, and prints
// "rank r ok". --die-rank R: rank R kills itself (SIGKILL) after connecting; --hang-rank R: rank R sleeps
// instead of joining the collectives. Exit status: 0 when every rank passed. Run by ranks_test.cpp.
#include <fmt/format.h>
#include <signal.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/process_groups.h"

using namespace dsaserve;
using namespace dsaserve::dist;

namespace {

void expect(bool ok, const std::string& what) { DSA_CHECK(ok, "check failed: {}", what); }

void run_collectives(Communicator& c) {
  const int64_t r = c.rank(), n = c.size();
  const float s = float(n * (n - 1) / 2);
  Tensor t = Tensor::from_vector({float(r), 1.f}, {2});
  c.all_reduce(t);
  expect(t.to_f32_vector() == std::vector<float>{s, float(n)}, "all_reduce");
  std::vector<float> in;
  for (int64_t i = 0; i < n; ++i) in.push_back(float(r * i));
  Tensor rs = Tensor::empty({1}, DType::f32);
  c.reduce_scatter(Tensor::from_vector(in, {n}), rs);
  expect(rs.to_f32_vector()[0] == s * float(r), "reduce_scatter");
  Tensor g = Tensor::empty({n}, DType::f32);
  c.all_gather(Tensor::from_vector({float(r)}, {1}), g);
  for (int64_t q = 0; q < n; ++q) expect(g.to_f32_vector()[size_t(q)] == float(q), "all_gather");
  std::vector<int64_t> rows;
  int64_t total = 0;
  for (int64_t q = 0; q < n; ++q) total += rows.emplace_back(q % 2 + 1);
  std::vector<float> mine(size_t(r % 2 + 1), float(r));
  Tensor gv = Tensor::empty({total}, DType::f32);
  c.all_gather_v(Tensor::from_vector(mine, {int64_t(mine.size())}), gv, rows);
  int64_t k = 0;
  for (int64_t q = 0; q < n; ++q)
    for (int64_t j = 0; j < rows[size_t(q)]; ++j)
      expect(gv.to_f32_vector()[size_t(k++)] == float(q), "all_gather_v");
  std::vector<float> a2a;
  for (int64_t q = 0; q < n; ++q) a2a.push_back(float(10 * r + q));
  Tensor a = Tensor::empty({n}, DType::f32);
  c.all_to_all(Tensor::from_vector(a2a, {n}), a);
  for (int64_t q = 0; q < n; ++q) expect(a.to_f32_vector()[size_t(q)] == float(10 * q + r), "all_to_all");
  // all_to_all_v: rank r sends (q + 1) rows valued 100 r + q to rank q, receives r + 1 from each.
  std::vector<int64_t> send, recv;
  std::vector<float> sv;
  for (int64_t q = 0; q < n; ++q) {
    send.push_back(q + 1);
    recv.push_back(r + 1);
    for (int64_t j = 0; j <= q; ++j) sv.push_back(float(100 * r + q));
  }
  Tensor av = Tensor::empty({n * (r + 1)}, DType::f32);
  c.all_to_all_v(Tensor::from_vector(sv, {int64_t(sv.size())}), send, av, recv);
  for (int64_t q = 0; q < n; ++q)
    for (int64_t j = 0; j <= r; ++j)
      expect(av.to_f32_vector()[size_t(q * (r + 1) + j)] == float(100 * q + r), "all_to_all_v");
  Tensor b = Tensor::from_vector({float(r)}, {1});
  c.broadcast(b, n - 1);
  expect(b.to_f32_vector()[0] == float(n - 1), "broadcast");
  c.barrier();
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);  // as dsaserve's main: a send to a killed peer is an error, not this rank's death
  std::vector<std::string> args(argv + 1, argv + argc);
  ParallelLayout layout;
  RankArgs rank;
  int64_t die = -1, hang = -1, timeout_s = 30;
  std::vector<std::string> launcher_args;  // what every rank gets: the args without the rank ones
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool has_value = i + 1 < args.size();
    if (a == "--dist-rank" && has_value) {
      rank.rank = std::stoll(args[++i]);
      continue;
    }
    if (a == "--dist-store" && has_value) {
      rank.store = args[++i];
      continue;
    }
    launcher_args.push_back(a);
    if (!has_value) continue;
    const std::string& v = args[i + 1];
    if (a == "--tp")
      layout.tp = std::stoll(v);
    else if (a == "--ep-size")
      layout.ep_size = std::stoll(v);
    else if (a == "--attn-dp-size")
      layout.attn_dp_size = std::stoll(v);
    else if (a == "--die-rank")
      die = std::stoll(v);
    else if (a == "--hang-rank")
      hang = std::stoll(v);
    else if (a == "--dist-timeout")
      timeout_s = std::stoll(v);
    else
      continue;
    launcher_args.push_back(v);
    ++i;
  }
  try {
    if (!rank.launched()) {
      LaunchSpec spec;
      spec.world_size = layout.tp;
      return launch_ranks("/proc/self/exe", launcher_args, spec);
    }
    GlooOptions opt;
    opt.timeout = std::chrono::seconds(timeout_s);
    auto groups = connect_gloo_ranks(layout, rank, opt);
    if (rank.rank == die) raise(SIGKILL);
    if (rank.rank == hang) std::this_thread::sleep_for(std::chrono::hours(1));
    for (GroupKind k : kAllGroups) run_collectives(groups->comm(k));
    fmt::print("rank {} ok\n", rank.rank);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: rank {}: {}\n", rank.rank, e.what());
    return 1;
  }
}
