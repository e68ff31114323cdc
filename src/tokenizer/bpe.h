#pragma once
// The BPE model of a tokenizer.json: vocab, ranked merges, unknown-token handling, and the merge loop.
// Words arrive either as text (each character an initial symbol) or, for byte-level tokenizers, as raw
// bytes (each byte an initial symbol spelled in the byte-level alphabet) so nothing is re-encoded.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/hash_table.h"

namespace dsaserve::tokenizer {

// A candidate merge of the heap loop: the pair starting at `pos` while that pair has version `version`.
struct BpeHeapEntry {
  uint64_t key;  // rank << 32 | pos: the lowest rank first, then the leftmost
  uint32_t version;
  uint32_t merged_id;
  bool operator>(const BpeHeapEntry& o) const { return key > o.key; }
};

// Scratch space reused across words (one per thread).
struct BpeScratch {
  std::vector<uint32_t> syms;
  std::vector<uint32_t> ranks;
  std::vector<int32_t> prev, next;
  std::vector<BpeHeapEntry> heap;
  std::string text;
};

// model.vocab and model.merges taken out of the JSON while it is parsed (see Tokenizer::from_json),
// which is much cheaper than building them as JSON values. Entries are in file order.
struct BpeLists {
  bool has_vocab = false, has_merges = false;
  std::vector<std::pair<std::string, nlohmann::json>> vocab;  // token -> id value
  std::vector<nlohmann::json> merges;                         // "a b" or ["a", "b"]
};

class BpeModel {
 public:
  // Reads tokenizer.json's "model" object (type BPE); errors name the field ("model.merges[3]").
  // `lists` holds vocab / merges when they were taken out of `model` while parsing.
  void load(const nlohmann::json& model, BpeLists lists = {});

  // Appends the ids of `word` to `out`. With raw_bytes, `word` holds raw bytes to be spelled in the
  // byte-level alphabet (the ByteLevel pre-tokenizer's output, not materialised).
  void tokenize(std::string_view word, bool raw_bytes, std::vector<uint32_t>& out, BpeScratch& scratch) const;

  std::optional<uint32_t> token_to_id(std::string_view token) const { return vocab_.find(token); }
  // The token spelled with id, or nullopt for an id outside the vocab.
  std::optional<std::string_view> id_to_token(uint32_t id) const;
  // Number of entries of the vocab (HF's get_vocab_size, which the added-token ids start from).
  size_t vocab_size() const { return vocab_.size(); }
  // One past the largest id of the vocab.
  uint32_t id_end() const { return static_cast<uint32_t>(token_off_.size()); }
  size_t merge_count() const { return merges_.size(); }
  // Merges symbols in place with the lowest rank first, leftmost on ties (exposed for tests).
  void merge(std::vector<uint32_t>& syms, BpeScratch& scratch) const;
  // The quadratic-scan and heap merge loops, which must agree (exposed for tests).
  void merge_small(std::vector<uint32_t>& syms, BpeScratch& scratch) const;
  void merge_large(std::vector<uint32_t>& syms, BpeScratch& scratch) const;

 private:
  void initial_symbols(std::string_view word, bool raw_bytes, std::vector<uint32_t>& syms,
                       BpeScratch& scratch) const;

  StringTable vocab_;                // token text -> id
  StringTable vocab_bytes_;          // raw bytes of byte-level spelled tokens -> id (for ignore_merges)
  std::string token_text_;           // id -> token text, via token_off_
  std::vector<uint64_t> token_off_;  // (offset << 24 | length); kNoToken for holes
  PairTable merges_;
  std::vector<int64_t> byte_ids_;  // raw byte -> id of its byte-level spelling, or -1
  std::optional<uint32_t> unk_id_;
  std::string unk_token_;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::vector<int64_t> byte_fallback_ids_;  // byte -> id of "<0xAB>", or -1
};

}  // namespace dsaserve::tokenizer
