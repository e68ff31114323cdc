#pragma once
// Incremental detokenizer for streaming: feed ids one at a time, get back only complete UTF-8 text.
// The concatenation of every step() and the final finish() equals Tokenizer::decode of all the ids,
// including ids whose bytes split a multi-byte character.
//
// A server holds one per request (cheap: a few bytes of state for byte-level tokenizers); it is not
// thread-safe itself, and the Tokenizer must outlive it.
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace dsaserve::tokenizer {

class DecodeStream {
 public:
  explicit DecodeStream(const Tokenizer& tokenizer, bool skip_special_tokens = false);

  // Feeds one id and appends the text it completes to `out`; returns the number of bytes appended
  // (0 while a character is still incomplete).
  size_t step(uint32_t id, std::string& out);
  std::string step(uint32_t id);
  // Ends the stream: appends what was held back (an unfinished character becomes U+FFFD, as in
  // decode) and resets the stream for reuse.
  size_t finish(std::string& out);
  std::string finish();
  // Forgets everything fed so far.
  void reset();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  // Byte-level decoders: bytes of a character that is not complete yet (at most 3).
  std::string pending_;
  // Other decoders (whose output for a token depends on its neighbours): HF's DecodeStream scheme,
  // decoding a short window of ids and emitting what extends the previous window's text.
  std::vector<uint32_t> ids_;
  std::string prefix_;
  size_t prefix_index_ = 0;
};

}  // namespace dsaserve::tokenizer
