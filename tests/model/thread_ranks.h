#pragma once
// Ranks of a parallel layout as threads of this process over Gloo (real TCP on 127.0.0.1, one store):
// the model tests' way to run a sharded forward without launching processes.
#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dist/gloo_communicator.h"
#include "dist/layout.h"
#include "dist/process_groups.h"
#include "dist/store.h"

namespace dsaserve::model {

// Runs body(groups, r) for every rank r of `layout` on its own thread with its process groups; returns
// each rank's error message ("" where it returned normally).
inline std::vector<std::string> run_thread_ranks(
    const dist::ParallelLayout& layout,
    const std::function<void(const dist::ProcessGroups& groups, int64_t rank)>& body) {
  using namespace std::chrono_literals;
  const int64_t n = layout.tp;
  dist::TcpStoreServer server("127.0.0.1", 0);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        dist::TcpStore store("127.0.0.1", server.port(), 20s);
        dist::GlooOptions o;
        o.timeout = 60s;
        const dist::ProcessGroups groups(
            layout, r, [&](const std::string& prefix, const std::string& group, int64_t rank, int64_t size) {
              return dist::make_gloo_communicator(store, prefix, group, rank, size, o);
            });
        body(groups, r);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace dsaserve::model
