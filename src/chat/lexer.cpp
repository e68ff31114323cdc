#include "chat/lexer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "chat/template_error.h"
#include "chat/value.h"

namespace dsaserve::chat {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

class Lexer {
 public:
  Lexer(const std::string& source, const LexerOptions& options) : o_(options) {
    // Newlines are normalized to \n; one trailing newline goes unless keep_trailing_newline.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!o_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    const size_t n = src_.size();
    while (pos_ < n) {
      const size_t q = find_tag(pos_);
      if (q == std::string::npos) {
        emit(TokenType::kData, src_.substr(pos_), pos_);
        break;
      }
      const char type = src_[q + 1];
      const char sign = (q + 2 < n && (src_[q + 2] == '-' || src_[q + 2] == '+')) ? src_[q + 2] : 0;
      std::string text = src_.substr(pos_, q - pos_);
      apply_lstrip(text, sign, type != '{');
      if (!text.empty()) emit(TokenType::kData, std::move(text), pos_);
      size_t p = q + 2 + (sign ? 1 : 0);
      if (type == '#') {
        lex_comment(q, p);
        continue;
      }
      if (type == '%' && try_raw(q, p)) continue;
      emit(type == '{' ? TokenType::kVarBegin : TokenType::kBlockBegin, src_.substr(q, p - q), q);
      pos_ = p;
      lex_tag(type == '%');
    }
    emit(TokenType::kEof, "", n);
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(size_t at, const std::string& msg) const {
    auto [line, col] = position(at);
    throw TemplateError(ErrorKind::kSyntax, line, col, msg);
  }

  std::pair<int, int> position(size_t at) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), at);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    return {static_cast<int>(line), static_cast<int>(at - line_starts_[line - 1] + 1)};
  }

  void emit(TokenType t, std::string value, size_t at) {
    auto [line, col] = position(at);
    tokens_.push_back(Token{t, std::move(value), line, col});
  }

  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  // Whitespace control on the text before a tag (jinja2's OptionalLStrip rule).
  void apply_lstrip(std::string& text, char sign, bool block_like) const {
    if (sign == '-') {
      size_t end = text.size();
      while (end > 0 && is_space(text[end - 1])) --end;
      text.resize(end);
    } else if (sign != '+' && o_.lstrip_blocks && block_like) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && l_pos < text.size() &&
          std::all_of(text.begin() + static_cast<std::ptrdiff_t>(l_pos), text.end(), is_space)) {
        text.resize(l_pos);
      }
    }
  }

  // After an end tag at [.., end): `-` strips following whitespace, `+` keeps it, else trim_blocks
  // removes one newline.
  size_t finish_end(size_t end, char sign) {
    if (sign == '-') {
      while (end < src_.size() && is_space(src_[end])) ++end;
    } else if (sign != '+' && o_.trim_blocks && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    line_starting_ = end > 0 && src_[end - 1] == '\n';
    return end;
  }

  void lex_comment(size_t q, size_t p) {
    const size_t k = src_.find("#}", p);
    if (k == std::string::npos) error(q, "Missing end of comment tag");
    const char sign = (k >= p + 1 && (src_[k - 1] == '-' || src_[k - 1] == '+')) ? src_[k - 1] : 0;
    pos_ = finish_end(k + 2, sign);
  }

  // {% raw %}...{% endraw %}: the content is data, untouched except for whitespace control.
  bool try_raw(size_t q, size_t p) {
    size_t j = p;
    while (j < src_.size() && is_space(src_[j])) ++j;
    if (src_.compare(j, 3, "raw") != 0) return false;
    j += 3;
    while (j < src_.size() && is_space(src_[j])) ++j;
    size_t content;
    if (src_.compare(j, 3, "-%}") == 0) {
      content = j + 3;
      while (content < src_.size() && is_space(src_[content])) ++content;
    } else if (src_.compare(j, 2, "%}") == 0) {
      content = j + 2;
    } else {
      return false;
    }
    line_starting_ = src_[content - 1] == '\n';
    // Find {%[-+]? \s* endraw \s* [-+]?%}
    for (size_t s = src_.find("{%", content); s != std::string::npos; s = src_.find("{%", s + 1)) {
      size_t t = s + 2;
      const char sign = (t < src_.size() && (src_[t] == '-' || src_[t] == '+')) ? src_[t] : 0;
      if (sign) ++t;
      while (t < src_.size() && is_space(src_[t])) ++t;
      if (src_.compare(t, 6, "endraw") != 0) continue;
      t += 6;
      while (t < src_.size() && is_space(src_[t])) ++t;
      char end_sign = 0;
      if (t < src_.size() && (src_[t] == '-' || src_[t] == '+')) end_sign = src_[t++];
      if (src_.compare(t, 2, "%}") != 0) continue;
      std::string text = src_.substr(content, s - content);
      apply_lstrip(text, sign, true);
      if (!text.empty()) emit(TokenType::kData, std::move(text), content);
      pos_ = finish_end(t + 2, end_sign);
      return true;
    }
    error(q, "Missing end of raw directive");
  }

  void lex_tag(bool block) {
    std::vector<char> brackets;
    const size_t n = src_.size();
    const size_t start = pos_;
    while (true) {
      while (pos_ < n && is_space(src_[pos_])) ++pos_;
      if (pos_ >= n)
        error(start, block ? "unexpected end of template, expected '%}'"
                           : "unexpected end of template, expected '}}'");
      if (brackets.empty()) {
        if (block) {
          for (const char* end : {"+%}", "-%}", "%}"}) {
            if (src_.compare(pos_, std::strlen(end), end) == 0) {
              const char sign = end[0] == '%' ? 0 : end[0];
              emit(TokenType::kBlockEnd, end, pos_);
              pos_ = finish_end(pos_ + std::strlen(end), sign);
              return;
            }
          }
        } else {
          for (const char* end : {"-}}", "}}"}) {
            if (src_.compare(pos_, std::strlen(end), end) == 0) {
              const char sign = end[0] == '-' ? '-' : '+';  // variables never trim a newline
              emit(TokenType::kVarEnd, end, pos_);
              pos_ = finish_end(pos_ + std::strlen(end), sign);
              return;
            }
          }
        }
      }
      lex_token(brackets);
    }
  }

  void lex_token(std::vector<char>& brackets) {
    const size_t n = src_.size();
    const size_t at = pos_;
    const char c = src_[pos_];
    if (is_name_start(c)) {
      size_t e = pos_;
      while (e < n && is_name_char(src_[e])) ++e;
      emit(TokenType::kName, src_.substr(pos_, e - pos_), at);
      pos_ = e;
      return;
    }
    if (is_digit(c)) {
      lex_number();
      return;
    }
    if (c == '\'' || c == '"') {
      lex_string();
      return;
    }
    static const char* two[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : two) {
      if (src_.compare(pos_, 2, op) == 0) {
        emit(TokenType::kOperator, op, at);
        pos_ += 2;
        return;
      }
    }
    if (std::strchr("+-/*%~[](){}><=.:|,;", c) && c != 0) {
      if (c == '(' || c == '[' || c == '{') {
        brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
      } else if (c == ')' || c == ']' || c == '}') {
        if (brackets.empty()) error(at, fmt::format("unexpected '{}'", c));
        if (brackets.back() != c)
          error(at, fmt::format("unexpected '{}', expected '{}'", c, brackets.back()));
        brackets.pop_back();
      }
      emit(TokenType::kOperator, std::string(1, c), at);
      ++pos_;
      return;
    }
    error(at, fmt::format("unexpected char '{}' at {}", c, at));
  }

  size_t digits(size_t p) const {
    // (\d+_)*\d+
    const size_t n = src_.size();
    if (p >= n || !is_digit(src_[p])) return std::string::npos;
    while (p < n && is_digit(src_[p])) {
      ++p;
      if (p + 1 < n && src_[p] == '_' && is_digit(src_[p + 1])) ++p;
    }
    return p;
  }

  void lex_number() {
    const size_t at = pos_;
    size_t e = digits(pos_);
    bool is_float = false;
    const bool after_dot = at > 0 && src_[at - 1] == '.';
    if (!after_dot) {
      size_t f = e;
      if (f < src_.size() && src_[f] == '.') {
        const size_t g = digits(f + 1);
        if (g != std::string::npos) {
          f = g;
          is_float = true;
        }
      }
      if (f < src_.size() && (src_[f] == 'e' || src_[f] == 'E')) {
        size_t g = f + 1;
        if (g < src_.size() && (src_[g] == '+' || src_[g] == '-')) ++g;
        const size_t h = digits(g);
        if (h != std::string::npos) {
          f = h;
          is_float = true;
        }
      }
      if (is_float) e = f;
    }
    std::string text;
    for (size_t i = at; i < e; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    emit(is_float ? TokenType::kFloat : TokenType::kInteger, text, at);
    pos_ = e;
  }

  void lex_string() {
    const size_t at = pos_;
    const char quote = src_[pos_];
    std::string out;
    size_t p = pos_ + 1;
    const size_t n = src_.size();
    auto hex = [&](size_t from, int count) -> long {
      if (from + static_cast<size_t>(count) > n) return -1;
      long v = 0;
      for (int i = 0; i < count; ++i) {
        const char h = src_[from + static_cast<size_t>(i)];
        int d;
        if (h >= '0' && h <= '9') {
          d = h - '0';
        } else if (h >= 'a' && h <= 'f') {
          d = h - 'a' + 10;
        } else if (h >= 'A' && h <= 'F') {
          d = h - 'A' + 10;
        } else {
          return -1;
        }
        v = v * 16 + d;
      }
      return v;
    };
    while (true) {
      if (p >= n) error(at, "unexpected end of string literal");
      const char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++p;
        continue;
      }
      if (p + 1 >= n) error(at, "unexpected end of string literal");
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          const int count = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          const long v = hex(p, count);
          if (v < 0 || v > 0x10FFFF) error(at, "invalid escape in string literal");
          utf8_append(out, static_cast<char32_t>(v));
          p += static_cast<size_t>(count);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            int v = e - '0';
            for (int k = 0; k < 2 && p < n && src_[p] >= '0' && src_[p] <= '7'; ++k)
              v = v * 8 + (src_[p++] - '0');
            utf8_append(out, static_cast<char32_t>(v));
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    emit(TokenType::kString, std::move(out), at);
    pos_ = p + 1;
  }

  LexerOptions o_;
  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  bool line_starting_ = true;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source, const LexerOptions& options) {
  return Lexer(source, options).run();
}

}  // namespace dsaserve::chat
