#pragma once
// Flat open-addressing hash tables for the tokenizer's hot paths (no per-entry allocation):
// StringTable maps byte strings to uint32 values, PairTable maps (uint32, uint32) to (rank, id).
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsaserve::tokenizer {

// A fast 64-bit hash of a byte string (multiply-mix over 8-byte words).
inline uint64_t hash_bytes(const char* p, size_t n) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t h = 0x243F6A8885A308D3ull ^ (n * kMul);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w ^ (uint64_t{n} << 56)) * kMul;
  }
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 32;
  return h;
}

inline size_t table_capacity_for(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  return cap;
}

// Byte string -> uint32. Keys live in the table's own arena; inserting an existing key overwrites.
class StringTable {
 public:
  void reserve(size_t n) {
    if (table_capacity_for(n) > slots_.size()) rehash(table_capacity_for(n));
  }
  void insert(std::string_view key, uint32_t value) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(table_capacity_for(size_ + 1));
    const uint64_t h = hash_bytes(key.data(), key.size());
    size_t i = h & (slots_.size() - 1);
    while (slots_[i].len != kEmpty) {
      if (slots_[i].hash == h && view(slots_[i]) == key) {
        slots_[i].value = value;
        return;
      }
      i = (i + 1) & (slots_.size() - 1);
    }
    slots_[i] = Slot{h, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size()), value};
    arena_.append(key);
    ++size_;
  }
  std::optional<uint32_t> find(std::string_view key) const {
    if (size_ == 0) return std::nullopt;
    const uint64_t h = hash_bytes(key.data(), key.size());
    size_t i = h & (slots_.size() - 1);
    while (slots_[i].len != kEmpty) {
      if (slots_[i].hash == h && view(slots_[i]) == key) return slots_[i].value;
      i = (i + 1) & (slots_.size() - 1);
    }
    return std::nullopt;
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint32_t kEmpty = 0xFFFFFFFFu;
  struct Slot {
    uint64_t hash = 0;
    uint32_t off = 0;
    uint32_t len = kEmpty;
    uint32_t value = 0;
  };
  std::string_view view(const Slot& s) const { return std::string_view(arena_).substr(s.off, s.len); }
  void rehash(size_t cap) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(cap, Slot{});
    for (const Slot& s : old) {
      if (s.len == kEmpty) continue;
      size_t i = s.hash & (cap - 1);
      while (slots_[i].len != kEmpty) i = (i + 1) & (cap - 1);
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  std::string arena_;
  size_t size_ = 0;
};

// (left id, right id) -> (rank, merged id). Inserting an existing pair overwrites it.
class PairTable {
 public:
  struct Value {
    uint32_t rank;
    uint32_t id;
  };
  void reserve(size_t n) { rehash(table_capacity_for(n)); }
  void insert(uint32_t a, uint32_t b, Value v) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(table_capacity_for(size_ + 1));
    const uint64_t key = pack(a, b);
    size_t i = index(key);
    while (slots_[i].key != kEmpty) {
      if (slots_[i].key == key) {
        slots_[i].value = v;
        return;
      }
      i = (i + 1) & (slots_.size() - 1);
    }
    slots_[i] = Slot{key, v};
    ++size_;
  }
  // nullptr when the pair has no merge.
  const Value* find(uint32_t a, uint32_t b) const {
    const uint64_t key = pack(a, b);
    size_t i = index(key);
    while (true) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == kEmpty) return nullptr;
      i = (i + 1) & (slots_.size() - 1);
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    Value value{};
  };
  static uint64_t pack(uint32_t a, uint32_t b) { return (uint64_t{a} << 32) | b; }
  size_t index(uint64_t key) const { return ((key * 0x9E3779B97F4A7C15ull) >> 20) & (slots_.size() - 1); }
  void rehash(size_t cap) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(cap, Slot{});
    for (const Slot& s : old) {
      if (s.key == kEmpty) continue;
      size_t i = index(s.key);
      while (slots_[i].key != kEmpty) i = (i + 1) & (cap - 1);
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_ = std::vector<Slot>(16);
  size_t size_ = 0;
};

}  // namespace dsaserve::tokenizer
