#pragma once
// Normalizers and pre-tokenizers of a tokenizer.json, flattened into lists of steps.
// Text is processed in a work buffer: pieces are byte ranges of it, and a step that rewrites text
// (prefixing, replacing, byte-level spelling) appends the new text to the buffer.
// Supported normalizers: Sequence, Prepend, Replace, Strip, ByteLevel.
// Supported pre-tokenizers: Sequence, Split (String or Regex pattern, every behavior, invert),
// ByteLevel (add_prefix_space, use_regex with GPT-2's pattern), Digits, Punctuation, Whitespace,
// WhitespaceSplit, BertPreTokenizer, CharDelimiterSplit, Metaspace.
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace dsaserve::tokenizer {

struct Piece {
  uint32_t begin = 0, end = 0;
  bool at_text_start = false;  // begins at offset 0 of the original text (Metaspace "first")
};

struct PipelineWork {
  std::string buf;
  std::vector<Piece> in, out;
  std::vector<std::pair<Piece, bool>> splits;  // (range, is_match) of one piece
  std::vector<std::pair<Piece, bool>> merged;  // (range, removed) after a split behavior
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// One pre-tokenizer step (a leaf of the Sequence tree).
class PreTokenizerStep {
 public:
  virtual ~PreTokenizerStep() = default;
  // Splits every piece of w.in into w.out.
  virtual void apply(PipelineWork& w) const = 0;
};

// One normalizer step.
class NormalizerStep {
 public:
  virtual ~NormalizerStep() = default;
  virtual void apply(std::string& text) const = 0;
};

class Normalizer {
 public:
  // `spec` is tokenizer.json's "normalizer" (null or an object); `where` names it in errors.
  void load(const nlohmann::json& spec, const std::string& where);
  bool empty() const { return steps_.empty(); }
  void apply(std::string& text) const;

 private:
  std::vector<std::unique_ptr<NormalizerStep>> steps_;
};

class PreTokenizer {
 public:
  void load(const nlohmann::json& spec, const std::string& where);
  // Splits w.in (pieces of w.buf) into words, left in w.in. With raw_bytes() the words are raw bytes
  // still to be spelled in the byte-level alphabet (a trailing ByteLevel step left for the model).
  void apply(PipelineWork& w) const;
  bool raw_bytes() const { return raw_bytes_; }

 private:
  std::vector<std::unique_ptr<PreTokenizerStep>> steps_;
  bool raw_bytes_ = false;
};

}  // namespace dsaserve::tokenizer
