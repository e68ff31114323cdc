#pragma once
// Lexer for the Jinja subset chat templates use. It splits the source into text and tag tokens and
// applies whitespace control exactly like jinja2's lexer: `-` strips, `+` keeps, trim_blocks drops the
// first newline after a block/comment tag, lstrip_blocks drops spaces/tabs before a block/comment tag
// at the start of a line, and one trailing newline of the source is removed.
#include <string>
#include <vector>

namespace dsaserve::chat {

enum class TokenType {
  kData,        // literal template text (after whitespace control)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,  // value holds the unescaped string
  kInteger,
  kFloat,
  kOperator,
  kEof,
};

struct Token {
  TokenType type;
  std::string value;
  int line = 1;
  int column = 1;
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Throws TemplateError (kind syntax) for unterminated tags, strings or comments and unbalanced brackets.
std::vector<Token> tokenize(const std::string& source, const LexerOptions& options);

}  // namespace dsaserve::chat
