#pragma once
// UTF-8 helpers shared by the tokenizer: validation, lossy decoding with the "maximal subpart" rule
// (one U+FFFD per invalid subpart, as Rust's String::from_utf8_lossy and Python's errors="replace"),
// and the GPT-2 byte-level alphabet (each byte <-> one printable code point).
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsaserve::tokenizer {

// Byte offset of the first invalid UTF-8 sequence in `s`, or s.size() when it is all valid.
size_t utf8_valid_prefix(std::string_view s);

// Length in bytes of the UTF-8 character starting with lead byte `b` (1 for invalid lead bytes).
inline size_t utf8_char_len(unsigned char b) {
  if (b < 0x80) return 1;
  if (b < 0xE0) return b < 0xC0 ? 1 : 2;
  if (b < 0xF0) return 3;
  return b < 0xF8 ? 4 : 1;
}

// Appends the lossy decoding of bytes [p, p+n) to `out`. With final=false, a trailing incomplete but
// so-far-valid sequence is not consumed (it may complete with later bytes). Returns the bytes consumed.
// Decoding a byte string in several calls (final only on the last) gives the same text as one call.
size_t append_utf8_lossy(const char* p, size_t n, std::string& out, bool final);

// Appends the UTF-8 encoding of code point `cp` to `out`.
void append_utf8(uint32_t cp, std::string& out);

// Decodes one UTF-8 character at s[i] (assumed valid); advances i.
uint32_t next_code_point(std::string_view s, size_t& i);

// The byte-level alphabet: byte b <-> code point byte_to_code_point()[b], as GPT-2's bytes_to_unicode.
const std::array<uint32_t, 256>& byte_to_code_point();
// UTF-8 spelling of the code point of every byte (1 or 2 bytes each).
const std::array<std::string, 256>& byte_to_utf8();
// Inverse: the byte for a code point of the alphabet, or -1.
int code_point_to_byte(uint32_t cp);
// Appends the byte-level spelling of raw bytes `s` to `out`.
void append_byte_level(std::string_view s, std::string& out);
// Maps a byte-level spelled string back to raw bytes; false when some character is outside the alphabet.
bool byte_level_to_bytes(std::string_view s, std::string& out);

}  // namespace dsaserve::tokenizer
