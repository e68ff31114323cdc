#pragma once
// Parser: tokens -> statement list, following jinja2's grammar and operator precedence
// (condexpr < or < and < not < comparisons/in < + - < ~ < * / // % < ** < unary - + < postfix/filters/is).
#include <string>
#include <vector>

#include "chat/ast.h"
#include "chat/lexer.h"

namespace dsaserve::chat {

// Throws TemplateError (kind syntax) naming line and column of the offending token.
Body parse_template(const std::vector<Token>& tokens);

}  // namespace dsaserve::chat
