#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/unicode_delta.h"
#include "tokenizer/utf8.h"

namespace dsaserve::tokenizer {
namespace {

// Per-thread matching state: match data (one ovector pair is all we read) and a JIT stack large
// enough for long subjects.
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  ThreadMatchState() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& match_state() {
  thread_local ThreadMatchState state;
  return state;
}

std::string_view unicode_delta(std::string_view category) {
  for (const UnicodeDelta& d : kUnicodeDelta) {
    if (d.category == category) return d.ranges;
  }
  return {};
}

// Rewrites an Oniguruma (Ruby syntax) pattern so PCRE2 reads it the same way: \h / \H are hex digits
// in Ruby (horizontal space in PCRE2), \s is White_Space, and \p{X} also takes the code points that
// Oniguruma's newer Unicode tables assign to X.
std::string translate_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size());
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 'h') {
        out += in_class ? "0-9a-fA-F" : "[0-9a-fA-F]";
      } else if (n == 'H' && !in_class) {
        out += "[^0-9a-fA-F]";
      } else if (n == 's') {
        out += in_class ? std::string(kWhiteSpaceClassBody) : "[" + std::string(kWhiteSpaceClassBody) + "]";
      } else if (n == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpaceClassBody) + "]";
      } else if ((n == 'p' || n == 'P') && i + 2 < p.size() && p[i + 2] == '{') {
        const size_t close = p.find('}', i + 3);
        if (close == std::string_view::npos) {
          out.append(p.substr(i));
          break;
        }
        std::string_view name = p.substr(i + 3, close - i - 3);
        bool negated = n == 'P';
        if (!name.empty() && name[0] == '^') {
          negated = !negated;
          name.remove_prefix(1);
        }
        const std::string_view delta = unicode_delta(name);
        const std::string prop = "\\p{" + std::string(name) + "}";
        if (delta.empty() || (in_class && negated)) {
          out.append(p.substr(i, close + 1 - i));
        } else if (in_class) {
          out += prop + std::string(delta);
        } else {
          out += (negated ? "[^" : "[") + prop + std::string(delta) + "]";
        }
        i = close;
        continue;
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == '[' && in_class && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class [:name:]
      const size_t close = p.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(p.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

Regex::Regex(std::string_view pattern, std::string_view what) : pattern_(pattern) {
  const std::string translated = translate_pattern(pattern);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    fail("{}: invalid regex \"{}\": {} at offset {}", what, pattern_, reinterpret_cast<const char*>(msg),
         static_cast<size_t>(err_off));
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

size_t Regex::char_len_at(const char* text, size_t i) {
  return utf8_char_len(static_cast<unsigned char>(text[i]));
}

bool Regex::search(const char* text, size_t n, size_t start, size_t& match_begin, size_t& match_end) const {
  ThreadMatchState& st = match_state();
  auto* code = static_cast<const pcre2_code*>(code_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text);
  const int rc = jit_ ? pcre2_jit_match(code, subject, n, start, 0, st.data, st.context)
                      : pcre2_match(code, subject, n, start, PCRE2_NO_UTF_CHECK, st.data, st.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof(msg));
    fail("regex \"{}\": matching failed: {}", pattern_, reinterpret_cast<const char*>(msg));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
  match_begin = ov[0];
  match_end = ov[1];
  return true;
}

std::string regex_escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-#&~ \t\n\r/").find(c) != std::string_view::npos) {
      if (c == '\t') {
        out += "\\t";
        continue;
      }
      if (c == '\n') {
        out += "\\n";
        continue;
      }
      if (c == '\r') {
        out += "\\r";
        continue;
      }
      out += '\\';
    }
    out += c;
  }
  return out;
}

}  // namespace dsaserve::tokenizer
