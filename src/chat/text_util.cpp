#include "chat/text_util.h"

#include <algorithm>

#include "chat/template_error.h"
#include "chat/value.h"

namespace dsaserve::chat {

bool py_is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
         c == 0x3000;
}

std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const std::u32string cps = utf8_decode(s);
  const std::u32string set = chars ? utf8_decode(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : py_is_space(c); };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip_it(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(cps[e - 1])) --e;
  }
  return utf8_encode(cps.substr(b, e - b));
}

std::vector<std::string> py_split(const std::string& s, const std::string* sep, int64_t maxsplit,
                                  bool from_right) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw_value_error(ErrorKind::kRuntime, "empty separator");
    if (!from_right) {
      size_t pos = 0;
      while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
        const size_t at = s.find(*sep, pos);
        if (at == std::string::npos) break;
        out.push_back(s.substr(pos, at - pos));
        pos = at + sep->size();
      }
      out.push_back(s.substr(pos));
    } else {
      size_t end = s.size();
      int64_t done = 0;
      while (maxsplit < 0 || done < maxsplit) {
        if (end < sep->size()) break;
        const size_t at = s.rfind(*sep, end - sep->size());
        if (at == std::string::npos) break;
        out.push_back(s.substr(at + sep->size(), end - at - sep->size()));
        end = at;
        ++done;
      }
      out.push_back(s.substr(0, end));
      std::reverse(out.begin(), out.end());
    }
    return out;
  }
  const std::u32string cps = utf8_decode(s);
  std::vector<std::u32string> parts;
  if (!from_right) {
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && py_is_space(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
        parts.push_back(cps.substr(i));  // the rest keeps its trailing whitespace
        break;
      }
      size_t j = i;
      while (j < cps.size() && !py_is_space(cps[j])) ++j;
      parts.push_back(cps.substr(i, j - i));
      i = j;
    }
  } else {
    size_t e = cps.size();
    while (e > 0) {
      while (e > 0 && py_is_space(cps[e - 1])) --e;
      if (e == 0) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
        parts.push_back(cps.substr(0, e));  // the rest keeps its leading whitespace
        break;
      }
      size_t b = e;
      while (b > 0 && !py_is_space(cps[b - 1])) --b;
      parts.push_back(cps.substr(b, e - b));
      e = b;
    }
    std::reverse(parts.begin(), parts.end());
  }
  for (auto& p : parts) out.push_back(utf8_encode(p));
  return out;
}

std::vector<std::string> py_splitlines(const std::string& s, bool keepends) {
  const std::u32string cps = utf8_decode(s);
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  auto is_break = [](char32_t c) {
    return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
           c == 0x85 || c == 0x2028 || c == 0x2029;
  };
  while (i < cps.size()) {
    if (is_break(cps[i])) {
      size_t end = i + 1;
      if (cps[i] == '\r' && end < cps.size() && cps[end] == '\n') ++end;
      out.push_back(utf8_encode(cps.substr(start, (keepends ? end : i) - start)));
      start = i = end;
    } else {
      ++i;
    }
  }
  if (start < cps.size()) out.push_back(utf8_encode(cps.substr(start)));
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts repl between every code point (and at both ends).
    const std::u32string cps = utf8_decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (i < cps.size()) utf8_append(out, cps[i]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, pos);
    if (at == std::string::npos) break;
    out.append(s, pos, at - pos);
    out += repl;
    pos = at + old.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

int64_t py_count(const std::string& s, const std::string& sub) {
  if (sub.empty()) return static_cast<int64_t>(utf8_decode(s).size()) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

namespace {

// Simple case mapping for Latin-1, Latin Extended-A, Greek, Cyrillic and fullwidth Latin.
char32_t lower_cp(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0xC0) return c;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  if (c >= 0x100 && c <= 0x137) return c | 1;
  if (c >= 0x139 && c <= 0x148) return (c & 1) ? c + 1 : c;
  if (c >= 0x14A && c <= 0x177) return c | 1;
  if (c == 0x178) return 0xFF;
  if (c >= 0x179 && c <= 0x17E) return (c & 1) ? c + 1 : c;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
  return c;
}

char32_t upper_cp(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0xB5) return c;
  if (c == 0xB5) return 0x39C;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c >= 0x100 && c <= 0x137) return c & ~char32_t{1};
  if (c >= 0x139 && c <= 0x148) return (c & 1) ? c : c - 1;
  if (c >= 0x14A && c <= 0x177) return c & ~char32_t{1};
  if (c >= 0x179 && c <= 0x17E) return (c & 1) ? c : c - 1;
  if (c == 0x17F) return 'S';
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 37;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x3B1 && c <= 0x3C9) return c - 32;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  if (c >= 0xFF41 && c <= 0xFF5A) return c - 32;
  return c;
}

bool is_cased(char32_t c) { return lower_cp(c) != c || upper_cp(c) != c || c == 0xDF; }

void append_upper(std::string& out, char32_t c) {
  if (c == 0xDF) {
    out += "SS";
  } else {
    utf8_append(out, upper_cp(c));
  }
}

}  // namespace

std::string py_upper(const std::string& s) {
  std::string out;
  for (char32_t c : utf8_decode(s)) append_upper(out, c);
  return out;
}

std::string py_lower(const std::string& s) {
  std::string out;
  for (char32_t c : utf8_decode(s)) utf8_append(out, lower_cp(c));
  return out;
}

std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : utf8_decode(s)) {
    if (prev_cased) {
      utf8_append(out, lower_cp(c));
    } else {
      append_upper(out, c);
    }
    prev_cased = is_cased(c);
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::string out;
  bool first = true;
  for (char32_t c : utf8_decode(s)) {
    if (first) {
      append_upper(out, c);
    } else {
      utf8_append(out, lower_cp(c));
    }
    first = false;
  }
  return out;
}

namespace {
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
}  // namespace

bool py_is_class(const std::string& s, const std::string& m) {
  if (s.empty()) return false;
  bool any_cased = false;
  for (char c : s) {
    const bool digit = c >= '0' && c <= '9';
    if (m == "isdigit" && !digit) return false;
    if (m == "isalpha" && !is_alpha(c)) return false;
    if (m == "isalnum" && !is_alpha(c) && !digit) return false;
    if (m == "isspace" && !py_is_space(static_cast<unsigned char>(c))) return false;
    if (m == "isupper" && c >= 'a' && c <= 'z') return false;
    if (m == "islower" && c >= 'A' && c <= 'Z') return false;
    any_cased = any_cased || is_alpha(c);
  }
  if (m == "isupper" || m == "islower") return any_cased;
  return true;
}

std::string jinja_title(const std::string& s) {
  // Words start after runs of [-\s({\[<]; each word: first char upper, rest lower.
  std::string out;
  bool word_start = true;
  for (char32_t c : utf8_decode(s)) {
    if (c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_is_space(c)) {
      utf8_append(out, c);
      word_start = true;
    } else {
      if (word_start) {
        append_upper(out, c);
      } else {
        utf8_append(out, lower_cp(c));
      }
      word_start = false;
    }
  }
  return out;
}

int64_t jinja_wordcount(const std::string& s) {
  int64_t n = 0;
  bool in_word = false;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    const bool w = is_alpha(c) || (c >= '0' && c <= '9') || c == '_' || u >= 0x80;
    if (w && !in_word) ++n;
    in_word = w;
  }
  return n;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string json_escape(std::string_view s) {
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          static const char* hex = "0123456789abcdef";
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  return out;
}

}  // namespace dsaserve::chat
