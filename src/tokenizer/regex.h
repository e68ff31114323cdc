#pragma once
// A compiled PCRE2 regex (UTF + Unicode properties, JIT when available) that reproduces how HF
// tokenizers iterates its Oniguruma regexes: non-overlapping matches left to right, skipping an empty
// match that starts right where the previous match ended. Safe to share between threads.
#include <cstddef>
#include <string>
#include <string_view>

namespace dsaserve::tokenizer {

class Regex {
 public:
  // Compiles `pattern` (Oniguruma/Ruby spelling as found in tokenizer.json); throws dsaserve::Error
  // naming `what` (e.g. the JSON field) when it does not compile.
  Regex(std::string_view pattern, std::string_view what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // First match in text[0, n) at or after `start`; false when none. Text must be valid UTF-8.
  bool search(const char* text, size_t n, size_t start, size_t& match_begin, size_t& match_end) const;

  // Calls fn(begin, end) for each match in text[0, n), in order, with the iteration rule above.
  template <class F>
  void for_each_match(const char* text, size_t n, F&& fn) const {
    size_t last_end = 0;
    bool have_last = false;
    size_t last_match_end = 0;
    while (last_end <= n) {
      size_t b, e;
      if (!search(text, n, last_end, b, e)) return;
      if (b == e && have_last && last_match_end == last_end) {
        last_end += last_end < n ? char_len_at(text, last_end) : 1;
        continue;
      }
      last_end = e;
      last_match_end = e;
      have_last = true;
      fn(b, e);
    }
  }

  const std::string& pattern() const { return pattern_; }

 private:
  static size_t char_len_at(const char* text, size_t i);
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// Unicode White_Space (Oniguruma's \s, Rust's char::is_whitespace) as the body of a regex class.
inline constexpr std::string_view kWhiteSpaceClassBody =
    "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

// Escapes `literal` so that it matches itself as a regex.
std::string regex_escape(std::string_view literal);

}  // namespace dsaserve::tokenizer
