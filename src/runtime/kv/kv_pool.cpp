#include "runtime/kv/kv_pool.h"

#include <numeric>

#include "core/error.h"

namespace dsaserve::runtime {

KvPool::KvPool(model::KvCache cache, int64_t reserved) : cache_(std::move(cache)), reserved_(reserved) {
  DSA_CHECK(cache_.num_pages > 0 && cache_.page_size > 0, "KV pool: {} pages of {} tokens", cache_.num_pages,
            cache_.page_size);
  DSA_CHECK(reserved >= 0 && reserved < cache_.num_pages, "KV pool: {} reserved of {} pages", reserved,
            cache_.num_pages);
  free_.resize(static_cast<size_t>(num_pages()));
  std::iota(free_.rbegin(), free_.rend(), 0);
  used_.assign(size_t(num_pages()), false);
}

int32_t KvPool::reserved_page(int64_t i) const {
  DSA_CHECK(i >= 0 && i < reserved_, "KV pool: reserved page {} of {}", i, reserved_);
  return int32_t(num_pages() + i);
}

std::vector<int32_t> KvPool::allocate(int64_t n) {
  DSA_CHECK(n >= 0, "KV pool: cannot allocate {} pages", n);
  DSA_CHECK(can_allocate(n), "KV pool too small: {} pages ({} tokens) needed, {} of {} pages free", n,
            n * page_size(), free_pages(), num_pages());
  std::vector<int32_t> out;
  out.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(free_.back());
    free_.pop_back();
    used_[size_t(out.back())] = true;
  }
  return out;
}

void KvPool::free(std::span<const int32_t> pages) {
  for (int32_t p : pages) {
    DSA_CHECK(p >= 0 && p < num_pages() && used_[size_t(p)], "KV pool: freeing page {} that is not allocated",
              p);
    used_[size_t(p)] = false;
    free_.push_back(p);
  }
}

void KvPool::check_integrity() const {
  std::vector<bool> seen(used_.size(), false);
  for (int32_t p : free_) {
    DSA_CHECK(p >= 0 && p < num_pages(), "KV pool: free list holds page {} outside the pool", p);
    DSA_CHECK(!seen[size_t(p)], "KV pool: page {} is twice in the free list", p);
    DSA_CHECK(!used_[size_t(p)], "KV pool: page {} is both free and allocated", p);
    seen[size_t(p)] = true;
  }
  int64_t used = 0;
  for (bool u : used_) used += u ? 1 : 0;
  DSA_CHECK(used + free_pages() == num_pages(), "KV pool: {} used + {} free != {} pages", used, free_pages(),
            num_pages());
}

}  // namespace dsaserve::runtime
