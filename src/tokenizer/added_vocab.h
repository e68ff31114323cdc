#pragma once
// Added tokens (tokenizer.json "added_tokens"): special and normal tokens matched in the text before
// the model runs, leftmost first and longest at a position, with the lstrip / rstrip / single_word /
// normalized rules and HF tokenizers' id assignment.
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tokenizer/hash_table.h"
#include "tokenizer/regex.h"

namespace dsaserve::tokenizer {

class BpeModel;
class Normalizer;

struct AddedToken {
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool operator==(const AddedToken&) const = default;
};

// One segment of a split: text [begin, end) when id is empty, else an added token covering it.
struct AddedSegment {
  size_t begin, end;
  std::optional<uint32_t> id;
};

class AddedVocab {
 public:
  void load(const nlohmann::json& added_tokens, const BpeModel& model, const Normalizer& normalizer);

  // Splits `text` on the added tokens whose `normalized` flag equals `normalized_set` (matched against
  // normalized text) into out (cleared first). parse_special=false leaves special tokens as text.
  void split(std::string_view text, bool normalized_set, bool parse_special,
             std::vector<AddedSegment>& out) const;

  std::optional<uint32_t> token_to_id(std::string_view content) const { return by_content_.find(content); }
  const AddedToken* token(uint32_t id) const;
  bool is_special_content(std::string_view content) const {
    return special_set_.count(std::string(content)) > 0;
  }
  // True when some added token (of either set) exists, i.e. split() can find something.
  bool has_tokens(bool normalized_set) const { return !tries_[normalized_set].nodes_terminal.empty(); }
  // One past the largest added-token id (0 when none).
  uint32_t id_end() const { return id_end_; }
  const std::unordered_map<uint32_t, AddedToken>& tokens() const { return by_id_; }

 private:
  struct Trie {
    PairTable edges;                      // (node, byte) -> child node (in rank)
    std::vector<int64_t> nodes_terminal;  // node -> token id, or -1
    uint64_t first_bytes[4] = {0, 0, 0, 0};
    void add(std::string_view pattern, uint32_t id);
    // Longest pattern starting at text[i]: its length and id, or 0.
    size_t longest_at(std::string_view text, size_t i, uint32_t& id) const;
  };
  bool ends_with_word(std::string_view s) const;
  bool starts_with_word(std::string_view s) const;
  size_t trailing_space_start(std::string_view s) const;
  size_t leading_space_len(std::string_view s) const;

  StringTable by_content_;
  std::unordered_map<uint32_t, AddedToken> by_id_;
  std::unordered_set<std::string> special_set_;
  StringTable special_table_;  // the same set, for lookups by string_view
  Trie tries_[2];              // [0]: normalized=false tokens, matched on raw text; [1]: normalized=true
  uint32_t id_end_ = 0;
  std::unique_ptr<Regex> word_char_, space_char_;
};

}  // namespace dsaserve::tokenizer
