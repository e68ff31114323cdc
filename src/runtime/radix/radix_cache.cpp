#include "runtime/radix/radix_cache.h"

#include <queue>

#include "core/error.h"

namespace dsaserve::runtime {

RadixCache::RadixCache(KvPool& pool, bool enabled)
    : pool_(pool),
      page_size_(pool.page_size()),
      enabled_(enabled),
      page_owner_(size_t(pool.num_pages()), -1) {
  nodes_.emplace_back();
  nodes_[0].alive = true;
  nodes_[0].lock_ref = 1;  // the root is never evicted
}

RadixCache::NodeId RadixCache::new_node(NodeId parent, std::vector<int32_t> key, int32_t page) {
  NodeId id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
    nodes_[size_t(id)] = Node{};
  } else {
    id = NodeId(nodes_.size());
    nodes_.emplace_back();
  }
  Node& n = nodes_[size_t(id)];
  n.parent = parent;
  n.key = std::move(key);
  n.page = page;
  n.alive = true;
  n.last_access = ++clock_;
  nodes_[size_t(parent)].children.emplace(n.key, id);
  page_owner_[size_t(page)] = id;
  ++num_pages_;
  return id;
}

RadixCache::Match RadixCache::match_prefix(std::span<const int32_t> tokens, int64_t max_tokens) {
  Match m;
  if (!enabled_) return m;
  const int64_t limit = std::min<int64_t>(max_tokens, int64_t(tokens.size()));
  NodeId cur = kRoot;
  std::vector<int32_t> key(static_cast<size_t>(page_size_));
  const uint64_t now = ++clock_;
  for (int64_t off = 0; off + page_size_ <= limit; off += page_size_) {
    std::copy(tokens.begin() + off, tokens.begin() + off + page_size_, key.begin());
    const auto& ch = nodes_[size_t(cur)].children;
    auto it = ch.find(key);
    if (it == ch.end()) break;
    cur = it->second;
    nodes_[size_t(cur)].last_access = now;
    m.pages.push_back(nodes_[size_t(cur)].page);
  }
  m.node = cur;
  m.num_tokens = int64_t(m.pages.size()) * page_size_;
  return m;
}

void RadixCache::lock(NodeId node) {
  for (NodeId n = node; n != kRoot; n = nodes_[size_t(n)].parent) {
    Node& x = nodes_[size_t(n)];
    DSA_CHECK(x.alive, "radix cache: locking a dead node {}", n);
    if (x.lock_ref++ == 0) ++locked_pages_;
  }
}

void RadixCache::unlock(NodeId node) {
  for (NodeId n = node; n != kRoot; n = nodes_[size_t(n)].parent) {
    Node& x = nodes_[size_t(n)];
    DSA_CHECK(x.alive && x.lock_ref > 0, "radix cache: unlocking node {} that is not locked", n);
    if (--x.lock_ref == 0) --locked_pages_;
  }
}

RadixCache::NodeId RadixCache::insert(std::span<const int32_t> tokens, std::span<const int32_t> pages) {
  DSA_CHECK(int64_t(tokens.size()) >= int64_t(pages.size()) * page_size_,
            "radix cache: {} tokens cannot fill {} pages", tokens.size(), pages.size());
  if (!enabled_) {
    pool_.free(pages);
    return kRoot;
  }
  NodeId cur = kRoot;
  const uint64_t now = ++clock_;
  for (size_t i = 0; i < pages.size(); ++i) {
    std::vector<int32_t> key(tokens.begin() + int64_t(i) * page_size_,
                             tokens.begin() + int64_t(i + 1) * page_size_);
    auto& ch = nodes_[size_t(cur)].children;
    auto it = ch.find(key);
    if (it != ch.end()) {
      cur = it->second;
      if (nodes_[size_t(cur)].page != pages[i]) pool_.free(pages.subspan(i, 1));  // already cached
    } else {
      DSA_CHECK(page_owner_[size_t(pages[i])] < 0, "radix cache: page {} inserted twice", pages[i]);
      cur = new_node(cur, std::move(key), pages[i]);
    }
    nodes_[size_t(cur)].last_access = now;
  }
  return cur;
}

int64_t RadixCache::evict(int64_t num_pages) {
  using Entry = std::pair<uint64_t, NodeId>;  // (last_access, node), oldest on top
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> leaves;
  for (size_t i = 1; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    if (n.alive && n.lock_ref == 0 && n.children.empty()) leaves.emplace(n.last_access, NodeId(i));
  }
  int64_t freed = 0;
  while (freed < num_pages && !leaves.empty()) {
    const NodeId id = leaves.top().second;
    leaves.pop();
    Node& n = nodes_[size_t(id)];
    const int32_t page = n.page;
    pool_.free(std::span<const int32_t>(&page, 1));
    page_owner_[size_t(page)] = -1;
    --num_pages_;
    ++freed;
    Node& parent = nodes_[size_t(n.parent)];
    parent.children.erase(n.key);
    const NodeId pid = n.parent;
    n = Node{};
    free_ids_.push_back(id);
    if (pid != kRoot && parent.lock_ref == 0 && parent.children.empty())
      leaves.emplace(parent.last_access, pid);
  }
  return freed;
}

bool RadixCache::holds_page(int32_t page) const {
  return page >= 0 && size_t(page) < page_owner_.size() && page_owner_[size_t(page)] >= 0;
}

void RadixCache::check_integrity() const {
  int64_t pages = 0, locked = 0;
  std::vector<bool> seen(page_owner_.size(), false);
  for (size_t i = 1; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    if (!n.alive) continue;
    ++pages;
    if (n.lock_ref > 0) ++locked;
    DSA_CHECK(n.page >= 0 && size_t(n.page) < page_owner_.size(), "radix cache: node {} has page {}", i,
              n.page);
    DSA_CHECK(!seen[size_t(n.page)], "radix cache: page {} is held by two nodes", n.page);
    seen[size_t(n.page)] = true;
    DSA_CHECK(page_owner_[size_t(n.page)] == NodeId(i), "radix cache: page owner of {} disagrees", n.page);
    DSA_CHECK(int64_t(n.key.size()) == page_size_, "radix cache: node {} key has {} tokens", i, n.key.size());
    const Node& p = nodes_[size_t(n.parent)];
    DSA_CHECK(p.alive, "radix cache: node {} has a dead parent", i);
    auto it = p.children.find(n.key);
    DSA_CHECK(it != p.children.end() && it->second == NodeId(i),
              "radix cache: node {} missing from its parent", i);
    DSA_CHECK(n.parent == kRoot || p.lock_ref >= n.lock_ref,
              "radix cache: node {} locked more than its parent", i);
    DSA_CHECK(n.lock_ref >= 0, "radix cache: node {} lock count {}", i, n.lock_ref);
  }
  for (size_t pg = 0; pg < page_owner_.size(); ++pg) {
    DSA_CHECK((page_owner_[pg] >= 0) == seen[pg], "radix cache: page {} owner table is stale", pg);
  }
  DSA_CHECK(pages == num_pages_, "radix cache: {} pages in the tree, counter says {}", pages, num_pages_);
  DSA_CHECK(locked == locked_pages_, "radix cache: {} locked pages, counter says {}", locked, locked_pages_);
}

}  // namespace dsaserve::runtime
