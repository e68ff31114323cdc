#include "tokenizer/utf8.h"

namespace dsaserve::tokenizer {
namespace {

// Allowed range of the second byte after lead byte b (the rest are 0x80..0xBF), per Unicode Table 3-7.
inline bool second_byte_ok(unsigned char lead, unsigned char b) {
  switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return b >= 0x80 && b <= 0xBF;
  }
}

// Length the sequence starting with `lead` must have; 0 for a byte that cannot start one.
inline size_t expected_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xC2) return 0;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF5) return 4;
  return 0;
}

// Examines the sequence at p[0..n): returns its length when valid, else sets `valid_prefix` to the
// length of its maximal valid prefix (>= 1 for the replacement) and `truncated` when the input ended
// before the sequence could be judged.
inline size_t check_sequence(const unsigned char* p, size_t n, size_t& bad_len, bool& truncated) {
  truncated = false;
  const size_t need = expected_len(p[0]);
  if (need == 1) return 1;
  if (need == 0) {
    bad_len = 1;
    return 0;
  }
  size_t k = 1;
  for (; k < need; ++k) {
    if (k >= n) {
      truncated = true;
      bad_len = k;
      return 0;
    }
    const bool ok = k == 1 ? second_byte_ok(p[0], p[1]) : (p[k] >= 0x80 && p[k] <= 0xBF);
    if (!ok) {
      bad_len = k;
      return 0;
    }
  }
  return need;
}

// Offset of the first invalid sequence in p[i..n), or n when the rest is valid; for an invalid one,
// `bad_len` and `truncated` as check_sequence() sets them.
size_t next_invalid(const unsigned char* p, size_t n, size_t i, size_t& bad_len, bool& truncated) {
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const size_t len = check_sequence(p + i, n - i, bad_len, truncated);
    if (len == 0) return i;
    i += len;
  }
  return n;
}

}  // namespace

size_t utf8_valid_prefix(std::string_view s) {
  size_t bad = 0;
  bool truncated = false;
  return next_invalid(reinterpret_cast<const unsigned char*>(s.data()), s.size(), 0, bad, truncated);
}

size_t append_utf8_lossy(const char* data, size_t n, std::string& out, bool final) {
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  size_t run = 0;  // [run, i) is valid text not yet appended
  for (size_t i = 0;;) {
    size_t bad = 0;
    bool truncated = false;
    i = next_invalid(p, n, i, bad, truncated);
    if (i == n) break;
    out.append(data + run, i - run);
    if (truncated && !final) return i;
    out.append("\xEF\xBF\xBD");
    i += bad;
    run = i;
  }
  out.append(data + run, n - run);
  return n;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t next_code_point(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  const size_t len = utf8_char_len(b0);
  uint32_t cp;
  switch (len) {
    case 2: cp = b0 & 0x1F; break;
    case 3: cp = b0 & 0x0F; break;
    case 4: cp = b0 & 0x07; break;
    default: ++i; return b0;
  }
  for (size_t k = 1; k < len && i + k < s.size(); ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += len;
  return cp;
}

const std::array<uint32_t, 256>& byte_to_code_point() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    // Printable Latin-1 bytes map to themselves; the others take 256, 257, ... in byte order.
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = keep ? b : next++;
    }
    return t;
  }();
  return table;
}

const std::array<std::string, 256>& byte_to_utf8() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    for (int b = 0; b < 256; ++b) append_utf8(byte_to_code_point()[b], t[b]);
    return t;
  }();
  return table;
}

int code_point_to_byte(uint32_t cp) {
  static const std::array<int16_t, 324> table = [] {
    std::array<int16_t, 324> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_code_point()[b]] = static_cast<int16_t>(b);
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

void append_byte_level(std::string_view s, std::string& out) {
  const auto& t = byte_to_utf8();
  for (unsigned char c : s) out.append(t[c]);
}

bool byte_level_to_bytes(std::string_view s, std::string& out) {
  size_t i = 0;
  while (i < s.size()) {
    const int b = code_point_to_byte(next_code_point(s, i));
    if (b < 0) return false;
    out.push_back(static_cast<char>(b));
  }
  return true;
}

}  // namespace dsaserve::tokenizer
