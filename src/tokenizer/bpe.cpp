#include "tokenizer/bpe.h"

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace dsaserve::tokenizer {
namespace {

constexpr uint64_t kNoToken = ~uint64_t{0};
constexpr uint32_t kNoRank = 0xFFFFFFFFu;
constexpr uint32_t kMaxId = 1u << 26;
// Words up to this many symbols use the quadratic scan (cheaper for short words); longer ones the heap.
constexpr size_t kSmallWord = 24;

std::optional<std::string> optional_string(const nlohmann::json& m, const char* key) {
  auto it = m.find(key);
  if (it == m.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) fail("model.{}: expected a string or null", key);
  return it->get<std::string>();
}

bool optional_bool(const nlohmann::json& m, const char* key) {
  auto it = m.find(key);
  if (it == m.end() || it->is_null()) return false;
  if (!it->is_boolean()) fail("model.{}: expected a boolean", key);
  return it->get<bool>();
}

}  // namespace

void BpeModel::load(const nlohmann::json& model, BpeLists lists) {
  if (!model.is_object()) fail("model: expected an object");
  auto type = model.find("type");
  if (type != model.end() && (!type->is_string() || type->get_ref<const std::string&>() != "BPE")) {
    fail("model.type: only \"BPE\" models are supported, got {}", type->dump());
  }
  auto dropout = model.find("dropout");
  if (dropout != model.end() && !dropout->is_null()) {
    if (!dropout->is_number()) fail("model.dropout: expected a number or null");
    if (dropout->get<double>() != 0.0)
      fail("model.dropout: BPE dropout is not supported (got {})", dropout->dump());
  }
  unk_token_ = optional_string(model, "unk_token").value_or("");
  const bool has_unk = optional_string(model, "unk_token").has_value();
  continuing_subword_prefix_ = optional_string(model, "continuing_subword_prefix").value_or("");
  end_of_word_suffix_ = optional_string(model, "end_of_word_suffix").value_or("");
  fuse_unk_ = optional_bool(model, "fuse_unk");
  byte_fallback_ = optional_bool(model, "byte_fallback");
  ignore_merges_ = optional_bool(model, "ignore_merges");

  // Vocab.
  if (!lists.has_vocab) {
    auto vocab_it = model.find("vocab");
    if (vocab_it == model.end()) fail("model.vocab: missing");
    if (!vocab_it->is_object()) fail("model.vocab: expected an object of token -> id");
    for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it)
      lists.vocab.emplace_back(it.key(), it.value());
  }
  vocab_.reserve(lists.vocab.size());
  uint32_t max_id = 0;
  for (const auto& [tok, v] : lists.vocab) {
    if (!v.is_number_unsigned())
      fail("model.vocab[\"{}\"]: expected a non-negative integer id, got {}", tok, v.dump());
    const uint64_t id = v.get<uint64_t>();
    if (id >= kMaxId) fail("model.vocab[\"{}\"]: id {} is too large", tok, id);
    max_id = std::max<uint32_t>(max_id, static_cast<uint32_t>(id));
  }
  token_off_.assign(lists.vocab.empty() ? 0 : max_id + 1, kNoToken);
  for (const auto& [tok, v] : lists.vocab) {
    const auto id = v.get<uint32_t>();
    vocab_.insert(tok, id);
    token_off_[id] = (uint64_t{token_text_.size()} << 24) | tok.size();
    token_text_ += tok;
  }

  // Merges: "a b" strings or ["a", "b"] pairs; a later duplicate overwrites the earlier rank.
  if (!lists.has_merges) {
    auto merges_it = model.find("merges");
    if (merges_it == model.end()) fail("model.merges: missing");
    if (!merges_it->is_array()) fail("model.merges: expected an array");
    lists.merges.assign(merges_it->begin(), merges_it->end());
  }
  merges_.reserve(lists.merges.size());
  const size_t prefix_len = continuing_subword_prefix_.size();
  uint32_t rank = 0;
  std::string merged;
  for (size_t i = 0; i < lists.merges.size(); ++i) {
    const auto& m = lists.merges[i];
    std::string_view a, b;
    if (m.is_string()) {
      const std::string& line = m.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos) {
        fail("model.merges[{}]: expected \"left right\" with exactly one space, got \"{}\"", i, line);
      }
      a = std::string_view(line).substr(0, sp);
      b = std::string_view(line).substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get_ref<const std::string&>();
      b = m[1].get_ref<const std::string&>();
    } else {
      fail("model.merges[{}]: expected a string \"left right\" or a pair [\"left\", \"right\"], got {}", i,
           m.dump());
    }
    const auto ia = vocab_.find(a), ib = vocab_.find(b);
    if (!ia) fail("model.merges[{}]: token \"{}\" is not in model.vocab", i, a);
    if (!ib) fail("model.merges[{}]: token \"{}\" is not in model.vocab", i, b);
    merged.assign(a);
    merged.append(b.substr(std::min(prefix_len, b.size())));
    const auto im = vocab_.find(merged);
    if (!im) fail("model.merges[{}]: merged token \"{}\" is not in model.vocab", i, merged);
    merges_.insert(*ia, *ib, {rank++, *im});
  }

  unk_id_.reset();
  if (has_unk) {
    unk_id_ = vocab_.find(unk_token_);
    if (!unk_id_) fail("model.unk_token: \"{}\" is not in model.vocab", unk_token_);
  }
  byte_ids_.assign(256, -1);
  byte_fallback_ids_.assign(256, -1);
  bool all_bytes = continuing_subword_prefix_.empty() && end_of_word_suffix_.empty();
  for (int c = 0; c < 256; ++c) {
    if (auto id = vocab_.find(byte_to_utf8()[c]))
      byte_ids_[c] = *id;
    else
      all_bytes = false;
    if (byte_fallback_) {
      const std::string code = fmt::format("<0x{:02X}>", c);
      if (auto id = vocab_.find(code)) byte_fallback_ids_[c] = *id;
    }
  }
  // The raw-byte path needs every byte spelled in the vocab; otherwise words are spelled out first.
  if (!all_bytes) byte_ids_.clear();
  if (ignore_merges_) {
    std::string raw;
    for (uint32_t id = 0; id < token_off_.size(); ++id) {
      if (token_off_[id] == kNoToken) continue;
      raw.clear();
      if (byte_level_to_bytes(*id_to_token(id), raw)) vocab_bytes_.insert(raw, id);
    }
  }
}

std::optional<std::string_view> BpeModel::id_to_token(uint32_t id) const {
  if (id >= token_off_.size() || token_off_[id] == kNoToken) return std::nullopt;
  const uint64_t e = token_off_[id];
  return std::string_view(token_text_).substr(e >> 24, e & 0xFFFFFF);
}

void BpeModel::initial_symbols(std::string_view word, bool raw_bytes, std::vector<uint32_t>& syms,
                               BpeScratch& scratch) const {
  syms.clear();
  if (raw_bytes && !byte_ids_.empty()) {
    for (unsigned char c : word) syms.push_back(static_cast<uint32_t>(byte_ids_[c]));
    return;
  }
  if (raw_bytes) {
    scratch.text.clear();
    append_byte_level(word, scratch.text);
    word = scratch.text;
  }
  // One symbol per character, with HF's prefix/suffix, byte-fallback and unknown-token rules.
  int64_t unk = -1;  // pending unknown-token id
  std::string piece;
  size_t i = 0;
  while (i < word.size()) {
    const size_t len = std::min(utf8_char_len(static_cast<unsigned char>(word[i])), word.size() - i);
    const bool first = i == 0, last = i + len == word.size();
    std::string_view s = word.substr(i, len);
    if ((!first && !continuing_subword_prefix_.empty()) || (last && !end_of_word_suffix_.empty())) {
      piece.clear();
      if (!first) piece += continuing_subword_prefix_;
      piece += s;
      if (last) piece += end_of_word_suffix_;
      s = piece;
    }
    i += len;
    if (auto id = vocab_.find(s)) {
      if (unk >= 0) syms.push_back(static_cast<uint32_t>(unk));
      unk = -1;
      syms.push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : s) all = all && byte_fallback_ids_[c] >= 0;
      if (all) {
        for (unsigned char c : s) syms.push_back(static_cast<uint32_t>(byte_fallback_ids_[c]));
        continue;
      }
    }
    if (unk_id_) {
      if (unk >= 0 && !fuse_unk_) syms.push_back(static_cast<uint32_t>(unk));
      unk = *unk_id_;
    }
  }
  if (unk >= 0) syms.push_back(static_cast<uint32_t>(unk));
}

void BpeModel::merge_small(std::vector<uint32_t>& syms, BpeScratch& scratch) const {
  size_t n = syms.size();
  if (n < 2) return;
  auto& ranks = scratch.ranks;
  auto& merged = scratch.prev;  // merged id of pair i
  ranks.resize(n);
  merged.resize(n);
  auto lookup = [&](size_t i) {
    const PairTable::Value* v = merges_.find(syms[i], syms[i + 1]);
    ranks[i] = v ? v->rank : kNoRank;
    merged[i] = v ? static_cast<int32_t>(v->id) : 0;
  };
  for (size_t i = 0; i + 1 < n; ++i) lookup(i);
  while (n > 1) {
    size_t best = 0;
    uint32_t best_rank = ranks[0];
    for (size_t i = 1; i + 1 < n; ++i) {
      if (ranks[i] < best_rank) {
        best_rank = ranks[i];
        best = i;
      }
    }
    if (best_rank == kNoRank) break;
    syms[best] = static_cast<uint32_t>(merged[best]);
    std::copy(syms.begin() + best + 2, syms.begin() + n, syms.begin() + best + 1);
    std::copy(ranks.begin() + best + 2, ranks.begin() + n, ranks.begin() + best + 1);
    std::copy(merged.begin() + best + 2, merged.begin() + n, merged.begin() + best + 1);
    --n;
    if (best > 0) lookup(best - 1);
    if (best + 1 < n) lookup(best);
  }
  syms.resize(n);
}

void BpeModel::merge_large(std::vector<uint32_t>& syms, BpeScratch& scratch) const {
  const size_t n = syms.size();
  if (n < 2) return;
  // Symbols form a doubly linked list; the heap holds candidate pairs by (rank, position). Each pair
  // position has a version, bumped whenever its left or right symbol changes, so a stale entry is
  // recognised without looking the pair up again. A removed symbol has version kDead.
  constexpr uint32_t kDead = 0xFFFFFFFFu;
  auto& prev = scratch.prev;
  auto& next = scratch.next;
  auto& heap = scratch.heap;
  std::vector<uint32_t>& version = scratch.ranks;
  prev.resize(n);
  next.resize(n);
  version.assign(n, 0);
  heap.clear();
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  auto push = [&](size_t i) {
    if (next[i] < 0) return;
    if (const PairTable::Value* v = merges_.find(syms[i], syms[next[i]])) {
      heap.push_back({(uint64_t{v->rank} << 32) | i, version[i], v->id});
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const BpeHeapEntry top = heap.back();
    heap.pop_back();
    const auto pos = static_cast<size_t>(top.key & 0xFFFFFFFFu);
    if (version[pos] != top.version) continue;
    const auto right = static_cast<size_t>(next[pos]);
    syms[pos] = top.merged_id;
    version[right] = kDead;
    ++version[pos];
    next[pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = static_cast<int32_t>(pos);
    if (prev[pos] >= 0) {
      ++version[prev[pos]];
      push(static_cast<size_t>(prev[pos]));
    }
    push(pos);
  }
  size_t w = 0;
  for (size_t i = 0; i < n; ++i) {
    if (version[i] != kDead) syms[w++] = syms[i];
  }
  syms.resize(w);
}

void BpeModel::merge(std::vector<uint32_t>& syms, BpeScratch& scratch) const {
  if (syms.size() <= kSmallWord)
    merge_small(syms, scratch);
  else
    merge_large(syms, scratch);
}

void BpeModel::tokenize(std::string_view word, bool raw_bytes, std::vector<uint32_t>& out,
                        BpeScratch& scratch) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const auto id = raw_bytes ? vocab_bytes_.find(word) : vocab_.find(word);
    if (id) {
      out.push_back(*id);
      return;
    }
  }
  initial_symbols(word, raw_bytes, scratch.syms, scratch);
  merge(scratch.syms, scratch);
  out.insert(out.end(), scratch.syms.begin(), scratch.syms.end());
}

}  // namespace dsaserve::tokenizer
