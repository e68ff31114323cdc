#pragma once
// A bounded cache of BPE results per word (one per thread and tokenizer, so it needs no lock).
// When it fills up it is cleared whole, which keeps it simple and its memory fixed.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/hash_table.h"

namespace dsaserve::tokenizer {

class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 64;

  // Appends the cached ids of `word` to `out` and returns true, or returns false on a miss.
  bool find(std::string_view word, std::vector<uint32_t>& out) const {
    if (slots_.empty() || word.size() > kMaxWordBytes) return false;
    const uint64_t h = hash_bytes(word.data(), word.size());
    size_t i = h & kMask;
    while (slots_[i].key_len != kEmpty) {
      const Slot& s = slots_[i];
      if (s.hash == h && s.key_len == word.size() &&
          std::memcmp(keys_.data() + s.key_off, word.data(), word.size()) == 0) {
        out.insert(out.end(), ids_.begin() + s.ids_off, ids_.begin() + s.ids_off + s.n_ids);
        return true;
      }
      i = (i + 1) & kMask;
    }
    return false;
  }

  void insert(std::string_view word, const uint32_t* ids, size_t n) {
    if (word.size() > kMaxWordBytes || n > 0xFFFF) return;
    if (slots_.empty() || size_ >= kMaxEntries) clear();
    const uint64_t h = hash_bytes(word.data(), word.size());
    size_t i = h & kMask;
    while (slots_[i].key_len != kEmpty) {
      if (slots_[i].hash == h && slots_[i].key_len == word.size() &&
          std::memcmp(keys_.data() + slots_[i].key_off, word.data(), word.size()) == 0) {
        return;
      }
      i = (i + 1) & kMask;
    }
    slots_[i] = Slot{h, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(ids_.size()),
                     static_cast<uint16_t>(word.size()), static_cast<uint16_t>(n)};
    keys_.append(word);
    ids_.insert(ids_.end(), ids, ids + n);
    ++size_;
  }

  void clear() {
    slots_.assign(kSlots, Slot{});
    keys_.clear();
    ids_.clear();
    size_ = 0;
  }

 private:
  static constexpr size_t kSlots = size_t{1} << 15;  // 768 KiB of slots per thread and tokenizer
  static constexpr size_t kMask = kSlots - 1;
  static constexpr size_t kMaxEntries = kSlots / 2;
  static constexpr uint16_t kEmpty = 0xFFFF;
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_off = 0;
    uint32_t ids_off = 0;
    uint16_t key_len = kEmpty;
    uint16_t n_ids = 0;
  };
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<uint32_t> ids_;
  size_t size_ = 0;
};

}  // namespace dsaserve::tokenizer
