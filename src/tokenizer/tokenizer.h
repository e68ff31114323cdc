#pragma once
// A Hugging Face tokenizer.json tokenizer (byte-level BPE as used by DeepSeek-V3.x and GLM-5.x),
// producing exactly the ids of HF tokenizers' encode(text, add_special_tokens=False).
//
// Pipeline per text: added tokens matched on the raw text (normalized=false ones) -> normalizer ->
// added tokens matched on the normalized text -> pre-tokenizer -> BPE per word (cached) -> ids.
// The post-processor, truncation and padding sections are not applied: callers (the chat template)
// add BOS/EOS themselves.
//
// A Tokenizer is immutable after loading and safe to share between threads: each thread keeps its own
// scratch space and bounded word cache for each tokenizer it uses.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsaserve::tokenizer {

class Tokenizer {
 public:
  // Loads `path`: a tokenizer.json file, or a directory holding one. Throws dsaserve::Error with a
  // message naming the file and the offending field.
  static Tokenizer from_file(const std::filesystem::path& path);
  // Loads from the JSON text; `origin` names it in error messages.
  static Tokenizer from_json(std::string_view json, std::string_view origin = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text` (valid UTF-8, else dsaserve::Error). parse_special=false leaves special
  // tokens' spellings to the model, like HF's encode_special_tokens=True.
  std::vector<uint32_t> encode(std::string_view text, bool parse_special = true) const;
  // Appends the ids of `text` to `out`.
  void encode(std::string_view text, std::vector<uint32_t>& out, bool parse_special = true) const;

  // Text of `ids`, like HF's decode: unknown ids are skipped, invalid UTF-8 becomes U+FFFD.
  std::string decode(std::span<const uint32_t> ids, bool skip_special_tokens = false) const;

  std::optional<uint32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(uint32_t id) const;
  // Whether `id` is a special token (one decode(..., skip_special_tokens=true) drops).
  bool is_special(uint32_t id) const;
  // Number of ids: the vocab and the added tokens (HF's get_vocab_size(with_added_tokens=True)).
  size_t vocab_size() const;

  // True when decoding is a per-token byte mapping followed by lossy UTF-8 decoding (ByteLevel
  // decoder): then token_bytes() gives each token's contribution and streaming is exact.
  bool bytewise_decoding() const;
  // The bytes `id` contributes to the decoded text (empty for unknown ids, or special ones when
  // skipping). Only meaningful when bytewise_decoding().
  std::string_view token_bytes(uint32_t id, bool skip_special_tokens) const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsaserve::tokenizer
