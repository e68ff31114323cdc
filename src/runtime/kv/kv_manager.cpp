#include "runtime/kv/kv_manager.h"

#include <algorithm>
#include <span>
#include <utility>

#include "core/error.h"

namespace dsaserve::runtime {

void KvManager::adopt_prefix(KvSeq& s, std::vector<int32_t> pages, int64_t tokens) {
  DSA_CHECK(s.empty(), "KV manager: the sequence already holds {} pages", s.pages.size());
  DSA_CHECK(tokens >= 0 && tokens <= int64_t(pages.size()) * page_size(),
            "KV manager: a prefix of {} tokens in {} pages of {}", tokens, pages.size(), page_size());
  s.pages = std::move(pages);
  s.prefix_pages = int64_t(s.pages.size());
  s.len = tokens;
  s.reserved = tokens;
}

int64_t KvManager::pages_needed(const KvSeq& s, int64_t n) const {
  DSA_CHECK(n >= 0, "KV manager: cannot reserve {} tokens", n);
  return std::max<int64_t>(0, pages_for(s.len + n) - int64_t(s.pages.size()));
}

void KvManager::reserve(KvSeq& s, int64_t n) {
  const int64_t need = pages_needed(s, n);
  if (need > 0) {
    const std::vector<int32_t> more = pool_.allocate(need);
    s.pages.insert(s.pages.end(), more.begin(), more.end());
    held_ += need;
  }
  s.reserved = std::max(s.reserved, s.len + n);
}

void KvManager::commit(KvSeq& s, int64_t n) {
  DSA_CHECK(n >= 0 && s.len + n <= s.reserved, "KV manager: committing {} tokens after {} of {} reserved", n,
            s.len, s.reserved);
  s.len += n;
}

int64_t KvManager::rollback(KvSeq& s, int64_t to) {
  const int64_t prefix_tokens = std::min(s.prefix_pages * page_size(), s.len);
  DSA_CHECK(to >= prefix_tokens && to <= s.reserved,
            "KV manager: cannot roll back to {} tokens (cached prefix {}, reserved {})", to, prefix_tokens,
            s.reserved);
  s.len = std::min(s.len, to);
  s.reserved = to;
  const int64_t keep = std::max(s.prefix_pages, pages_for(to));
  const int64_t drop = int64_t(s.pages.size()) - keep;
  if (drop <= 0) return 0;
  pool_.free(std::span<const int32_t>(s.pages).subspan(size_t(keep)));
  s.pages.resize(size_t(keep));
  held_ -= drop;
  return drop;
}

std::vector<int32_t> KvManager::release(KvSeq& s) {
  const int64_t full = std::min<int64_t>(s.len / page_size(), int64_t(s.pages.size()));
  const std::span<const int32_t> pt(s.pages);
  // Pages past the full committed ones that the request owns (prefix pages are always full ones).
  const size_t first_free = size_t(std::max(full, s.prefix_pages));
  pool_.free(pt.subspan(first_free));
  held_ -= s.own_pages();
  std::vector<int32_t> kept(pt.begin(), pt.begin() + std::ptrdiff_t(first_free));
  s = KvSeq();
  return kept;
}

void KvManager::check(const KvSeq& s) const {
  DSA_CHECK(s.prefix_pages >= 0 && s.prefix_pages <= int64_t(s.pages.size()),
            "KV manager: {} prefix pages of a {}-page table", s.prefix_pages, s.pages.size());
  DSA_CHECK(s.len >= 0 && s.len <= s.reserved && s.reserved <= int64_t(s.pages.size()) * page_size(),
            "KV manager: {} committed, {} reserved tokens in {} pages of {}", s.len, s.reserved,
            s.pages.size(), page_size());
}

}  // namespace dsaserve::runtime
