#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace dsaserve {

namespace {

// A fixed pool: one job at a time, split into chunks claimed through an atomic counter.
class Pool {
 public:
  explicit Pool(int n) : n_(std::max(1, n)) {
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this] { worker(); });
  }
  ~Pool() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return n_; }

  void run(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t)>& fn) {
    std::lock_guard run_lk(run_mu_);  // one parallel region at a time
    {
      std::lock_guard lk(mu_);
      fn_ = &fn;
      n_items_ = n;
      chunk_ = chunk;
      next_.store(0);
      active_ = int(workers_.size());
      ++generation_;
    }
    cv_.notify_all();
    work();
    std::unique_lock lk(mu_);
    done_cv_.wait(lk, [&] { return active_ == 0; });
    fn_ = nullptr;
  }

 private:
  void work() {
    for (;;) {
      const int64_t b = next_.fetch_add(chunk_);
      if (b >= n_items_) break;
      (*fn_)(b, std::min(n_items_, b + chunk_));
    }
  }
  void worker() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      tls_in_pool = true;
      work();
      tls_in_pool = false;
      std::lock_guard lk(mu_);
      if (--active_ == 0) done_cv_.notify_one();
    }
  }

 public:
  static thread_local bool tls_in_pool;

 private:
  int n_;
  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_items_ = 0, chunk_ = 1;
  std::atomic<int64_t> next_{0};
  int active_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

thread_local bool Pool::tls_in_pool = false;

int default_threads() { return int(std::max(1u, std::thread::hardware_concurrency())); }

std::mutex g_pool_mu;
std::unique_ptr<Pool> g_pool;

Pool& pool() {
  std::lock_guard lk(g_pool_mu);
  if (!g_pool) g_pool = std::make_unique<Pool>(default_threads());
  return *g_pool;
}

}  // namespace

int num_threads() { return pool().size(); }

void set_num_threads(int n) {
  std::lock_guard lk(g_pool_mu);
  g_pool = std::make_unique<Pool>(n);
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  Pool& p = pool();
  if (n <= grain || p.size() == 1 || Pool::tls_in_pool) {
    fn(0, n);
    return;
  }
  // About four chunks per thread for balance, never smaller than the grain.
  const int64_t chunk = std::max(grain, (n + 4 * p.size() - 1) / (4 * p.size()));
  Pool::tls_in_pool = true;
  p.run(n, chunk, fn);
  Pool::tls_in_pool = false;
}

}  // namespace dsaserve
