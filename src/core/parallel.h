#pragma once
// A process-wide pool of worker threads for the CPU operators.
// parallel_for(n, grain, fn) calls fn(begin, end) over disjoint ranges covering [0, n); ranges hold at
// least `grain` items (except the last). It runs inline when n <= grain or there is one thread.
// Threads: set_num_threads (the dsaserve binary: --threads, else DSASERVE_THREADS), else the hardware
// concurrency. Nested calls run inline.
#include <cstdint>
#include <functional>

namespace dsaserve {

int num_threads();
void set_num_threads(int n);  // before first use, or between parallel regions
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace dsaserve
