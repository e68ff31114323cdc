#include "tokenizer/added_vocab.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/json_util.h"
#include "tokenizer/pre_tokenizer.h"

namespace dsaserve::tokenizer {

void AddedVocab::Trie::add(std::string_view pattern, uint32_t id) {
  if (nodes_terminal.empty()) nodes_terminal.push_back(-1);
  uint32_t node = 0;
  for (unsigned char c : pattern) {
    if (const PairTable::Value* v = edges.find(node, c)) {
      node = v->rank;
    } else {
      const auto child = static_cast<uint32_t>(nodes_terminal.size());
      nodes_terminal.push_back(-1);
      edges.insert(node, c, {child, 0});
      node = child;
    }
  }
  // The first pattern with a given spelling wins, as in HF's matcher (equal spellings share an id).
  if (nodes_terminal[node] < 0) nodes_terminal[node] = id;
  const auto c0 = static_cast<unsigned char>(pattern[0]);
  first_bytes[c0 >> 6] |= uint64_t{1} << (c0 & 63);
}

size_t AddedVocab::Trie::longest_at(std::string_view text, size_t i, uint32_t& id) const {
  const auto c0 = static_cast<unsigned char>(text[i]);
  if (!(first_bytes[c0 >> 6] >> (c0 & 63) & 1)) return 0;
  uint32_t node = 0;
  size_t best = 0;
  for (size_t k = i; k < text.size(); ++k) {
    const PairTable::Value* v = edges.find(node, static_cast<unsigned char>(text[k]));
    if (v == nullptr) break;
    node = v->rank;
    if (nodes_terminal[node] >= 0) {
      best = k + 1 - i;
      id = static_cast<uint32_t>(nodes_terminal[node]);
    }
  }
  return best;
}

void AddedVocab::load(const nlohmann::json& added_tokens, const BpeModel& model,
                      const Normalizer& normalizer) {
  // The word and space classes of the Rust regex crate, used by single_word / lstrip / rstrip.
  word_char_ =
      std::make_unique<Regex>("[\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]", "added token rules");
  space_char_ = std::make_unique<Regex>("[" + std::string(kWhiteSpaceClassBody) + "]", "added token rules");
  if (added_tokens.is_null()) return;
  if (!added_tokens.is_array()) fail("added_tokens: expected an array, got {}", added_tokens.type_name());

  // Ids follow HF tokenizers: a content already known keeps its id, a new one takes the next free id
  // after the model's vocab (the "id" field is only what the file expects).
  std::vector<AddedToken> special_list, normal_list;
  std::unordered_map<std::string, uint32_t> content_ids;
  std::optional<uint32_t> max_added;
  const auto vocab_size = static_cast<uint32_t>(model.vocab_size());
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const auto& t = added_tokens[i];
    const std::string where = fmt::format("added_tokens[{}]", i);
    AddedToken tok;
    tok.content = string_field(t, "content", where);
    const auto& id_field = required_field(t, "id", where);
    if (!id_field.is_number_unsigned())
      fail("{}.id: expected a non-negative integer, got {}", where, id_field.dump());
    tok.special = bool_field(t, "special", where, false);
    tok.single_word = bool_field(t, "single_word", where, false);
    tok.lstrip = bool_field(t, "lstrip", where, false);
    tok.rstrip = bool_field(t, "rstrip", where, false);
    tok.normalized = bool_field(t, "normalized", where, !tok.special);
    if (tok.special && !tok.content.empty() && !special_set_.count(tok.content)) {
      special_set_.insert(tok.content);
      special_list.push_back(tok);
    }
    if (tok.content.empty()) continue;
    bool same = false;
    for (const auto& [id, existing] : by_id_) same = same || existing == tok;
    if (same) continue;
    uint32_t id;
    if (auto it = content_ids.find(tok.content); it != content_ids.end()) {
      id = it->second;
    } else if (auto mid = model.token_to_id(tok.content)) {
      id = *mid;
    } else if (!max_added) {
      id = vocab_size;
    } else {
      id = (*max_added >= vocab_size || vocab_size == 0) ? *max_added + 1 : vocab_size;
    }
    content_ids[tok.content] = id;
    max_added = std::max(max_added.value_or(0), id);
    by_id_[id] = tok;
    if (!special_set_.count(tok.content)) normal_list.push_back(tok);
  }
  for (const std::string& content : special_set_) special_table_.insert(content, 1);
  for (const auto& [content, id] : content_ids) {
    by_content_.insert(content, id);
    id_end_ = std::max(id_end_, id + 1);
  }
  auto id_of = [&](const std::string& content) -> uint32_t {
    if (auto id = by_content_.find(content)) return *id;
    return *model.token_to_id(content);
  };
  for (const auto* list : {&special_list, &normal_list}) {
    for (const AddedToken& tok : *list) {
      if (!tok.normalized) {
        tries_[0].add(tok.content, id_of(tok.content));
      } else {
        std::string pattern = tok.content;
        normalizer.apply(pattern);
        if (!pattern.empty()) tries_[1].add(pattern, id_of(tok.content));
      }
    }
  }
}

const AddedToken* AddedVocab::token(uint32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

bool AddedVocab::ends_with_word(std::string_view s) const {
  if (s.empty()) return false;
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  size_t b, e;
  return word_char_->search(s.data() + start, s.size() - start, 0, b, e) && b == 0;
}

bool AddedVocab::starts_with_word(std::string_view s) const {
  size_t b, e;
  return !s.empty() && word_char_->search(s.data(), s.size(), 0, b, e) && b == 0;
}

size_t AddedVocab::trailing_space_start(std::string_view s) const {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t b, e;
    if (!space_char_->search(s.data() + start, end - start, 0, b, e) || b != 0) break;
    end = start;
  }
  return end;
}

size_t AddedVocab::leading_space_len(std::string_view s) const {
  size_t i = 0, b, e;
  while (i < s.size() && space_char_->search(s.data() + i, s.size() - i, 0, b, e) && b == 0) i = e + i;
  return i;
}

void AddedVocab::split(std::string_view text, bool normalized_set, bool parse_special,
                       std::vector<AddedSegment>& out) const {
  out.clear();
  const Trie& trie = tries_[normalized_set];
  size_t start_offset = 0;
  if (!trie.nodes_terminal.empty()) {
    size_t i = 0;
    while (i < text.size()) {
      uint32_t id = 0;
      const size_t len = trie.longest_at(text, i, id);
      if (len == 0) {
        ++i;
        continue;
      }
      size_t start = i, stop = i + len;
      i = stop;  // the matcher resumes after this match even when the rules below discard it
      const AddedToken& tok = by_id_.at(id);
      if (!parse_special && special_set_.count(tok.content)) continue;
      if (tok.single_word) {
        const bool start_space = start == 0 || !ends_with_word(text.substr(0, start));
        const bool stop_space = stop == text.size() || !starts_with_word(text.substr(stop));
        if (!start_space || !stop_space) continue;
      }
      if (tok.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), start_offset);
      if (tok.rstrip) stop += leading_space_len(text.substr(stop));
      if (start_offset < start) out.push_back({start_offset, start, std::nullopt});
      out.push_back({start, stop, id});
      start_offset = stop;
    }
  }
  if (start_offset != text.size()) out.push_back({start_offset, text.size(), std::nullopt});
}

}  // namespace dsaserve::tokenizer
