// Expressions: jinja2's precedence climbing (condexpr, or, and, not, compare, + -, ~, * / // %, **, unary,
// postfix, filters and tests).
#include <algorithm>

#include "chat/builtins.h"
#include "chat/parser_internal.h"

namespace dsaserve::chat::detail {

ExprPtr Parser::parse_tuple(bool simplified, bool with_condexpr, std::initializer_list<const char*> extra_end,
                            bool explicit_parentheses) {
  const SrcPos p = pos();
  std::vector<ExprPtr> args;
  bool is_tuple = false;
  while (true) {
    if (!args.empty()) expect_op(",");
    const TokenType tt = cur().type;
    if (tt == TokenType::kBlockEnd || tt == TokenType::kVarEnd || tt == TokenType::kEof || is_op(")") ||
        is_end_name(extra_end)) {
      break;
    }
    args.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
    if (is_op(",")) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple) {
    if (!args.empty()) return std::move(args[0]);
    if (!explicit_parentheses) fail_at(cur(), fmt::format("Expected an expression, got {}", describe(cur())));
  }
  auto t = make(ExprKind::kTuple, p);
  t->children = std::move(args);
  return bounded(std::move(t));
}

ExprPtr Parser::parse_condexpr() {
  // jinja2 compiles the whole inline if (both branches too) in a soft frame; whether an expression is
  // an inline if is only known at its `if`, so the first branch is re-checked below.
  const size_t start = i_;
  const bool outer_soft = soft_;
  ExprPtr expr1;
  try {
    expr1 = parse_or();
  } catch (const TemplateError&) {
    if (outer_soft) throw;
    i_ = start;
    const SoftScope soft(this, true);
    expr1 = parse_or();
    if (!is_name("if")) {
      i_ = start;
      soft_ = false;
      expr1 = parse_or();  // throws the original error
    }
  }
  const SoftScope soft(this, true);
  while (is_name("if")) {
    const SrcPos p = pos();
    next();
    ExprPtr cond = parse_or();
    ExprPtr other;
    if (is_name("else")) {
      next();
      other = parse_condexpr();
    }
    auto e = make(ExprKind::kCondExpr, p);
    e->children.push_back(std::move(cond));
    e->children.push_back(std::move(expr1));
    e->children.push_back(std::move(other));
    expr1 = bounded(std::move(e));
  }
  return expr1;
}

ExprPtr Parser::parse_or() {
  ExprPtr left = parse_and();
  while (is_name("or")) {
    const SrcPos p = pos();
    next();
    left = binary("or", std::move(left), parse_and(), p);
  }
  return left;
}

ExprPtr Parser::parse_and() {
  ExprPtr left = parse_not();
  while (is_name("and")) {
    const SrcPos p = pos();
    next();
    left = binary("and", std::move(left), parse_not(), p);
  }
  return left;
}

ExprPtr Parser::parse_not() {
  const DepthGuard guard(this);
  if (is_name("not")) {
    auto e = make(ExprKind::kNot, pos());
    next();
    e->children.push_back(parse_not());
    return bounded(std::move(e));
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  const SrcPos p = pos();
  ExprPtr expr = parse_math1();
  std::vector<ExprPtr> rest;
  std::vector<std::string> ops;
  while (true) {
    if (cur().type == TokenType::kOperator &&
        (cur().value == "==" || cur().value == "!=" || cur().value == "<" || cur().value == "<=" ||
         cur().value == ">" || cur().value == ">=")) {
      ops.push_back(cur().value);
      next();
      rest.push_back(parse_math1());
    } else if (is_name("in")) {
      ops.push_back("in");
      next();
      rest.push_back(parse_math1());
    } else if (is_name("not") && peek().type == TokenType::kName && peek().value == "in") {
      ops.push_back("notin");
      next();
      next();
      rest.push_back(parse_math1());
    } else {
      break;
    }
  }
  if (ops.empty()) return expr;
  auto e = make(ExprKind::kCompare, p);
  e->children.push_back(std::move(expr));
  for (auto& r : rest) e->children.push_back(std::move(r));
  e->ops = std::move(ops);
  return bounded(std::move(e));
}

ExprPtr Parser::parse_concat() {
  ExprPtr left = parse_math2();
  while (is_op("~")) {
    const SrcPos p = pos();
    next();
    left = binary("~", std::move(left), parse_math2(), p);
  }
  return left;
}

ExprPtr Parser::parse_pow() {
  ExprPtr left = parse_unary(true);
  while (is_op("**")) {
    const SrcPos p = pos();
    next();
    left = binary("**", std::move(left), parse_unary(true), p);
  }
  return left;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  const DepthGuard guard(this);
  ExprPtr node;
  if (is_op("-") || is_op("+")) {
    node = make(is_op("-") ? ExprKind::kNeg : ExprKind::kPos, pos());
    next();
    node->children.push_back(parse_unary(false));
  } else {
    node = parse_primary();
  }
  node = parse_postfix(bounded(std::move(node)));
  if (with_filter) node = parse_filter_expr(std::move(node));
  return node;
}

ExprPtr Parser::parse_primary() {
  const Token& t = cur();
  const SrcPos p = pos();
  if (t.type == TokenType::kName) {
    auto e = make(ExprKind::kLiteral, p);
    if (t.value == "true" || t.value == "True") {
      e->literal = Value(true);
    } else if (t.value == "false" || t.value == "False") {
      e->literal = Value(false);
    } else if (t.value == "none" || t.value == "None") {
      e->literal = Value::none();
    } else {
      e->kind = ExprKind::kName;
      e->name = t.value;
    }
    next();
    return e;
  }
  if (t.type == TokenType::kString) {
    std::string s;
    while (cur().type == TokenType::kString) {
      s += cur().value;
      next();
    }
    auto e = make(ExprKind::kLiteral, p);
    e->literal = Value(std::move(s));
    return e;
  }
  if (t.type == TokenType::kInteger) {
    auto e = make(ExprKind::kLiteral, p);
    try {
      e->literal = Value(static_cast<int64_t>(std::stoll(t.value)));
    } catch (const std::exception&) {  // past 64 bits: a float (Python keeps the integer exact)
      try {
        e->literal = Value(std::stod(t.value));
      } catch (const std::exception&) {
        fail_at(t, "integer literal too large");
      }
    }
    next();
    return e;
  }
  if (t.type == TokenType::kFloat) {
    auto e = make(ExprKind::kLiteral, p);
    try {
      e->literal = Value(std::stod(t.value));
    } catch (const std::exception&) {
      fail_at(t, "float literal out of range");
    }
    next();
    return e;
  }
  if (is_op("(")) {
    next();
    ExprPtr e = parse_tuple(false, true, {}, true);
    expect_op(")");
    return e;
  }
  if (is_op("[")) {
    auto e = make(ExprKind::kList, p);
    next();
    while (!is_op("]")) {
      if (!e->children.empty()) expect_op(",");
      if (is_op("]")) break;
      e->children.push_back(parse_expression(true));
    }
    next();
    return bounded(std::move(e));
  }
  if (is_op("{")) {
    auto e = make(ExprKind::kDict, p);
    next();
    while (!is_op("}")) {
      if (!e->children.empty()) expect_op(",");
      if (is_op("}")) break;
      e->children.push_back(parse_expression(true));
      expect_op(":");
      e->children.push_back(parse_expression(true));
    }
    next();
    return bounded(std::move(e));
  }
  fail_at(t, fmt::format("unexpected {}", describe(t)));
}

ExprPtr Parser::parse_postfix(ExprPtr node) {
  while (true) {
    if (is_op(".") || is_op("[")) {
      node = parse_subscript(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
  while (true) {
    if (is_op("|")) {
      node = parse_filter(std::move(node), false);
    } else if (is_name("is")) {
      node = parse_test(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr node) {
  const SrcPos p = pos();
  if (is_op(".")) {
    next();
    if (cur().type == TokenType::kName) {
      auto e = make(ExprKind::kGetattr, p);
      e->name = cur().value;
      next();
      e->children.push_back(std::move(node));
      return bounded(std::move(e));
    }
    if (cur().type == TokenType::kInteger) {
      auto e = make(ExprKind::kGetitem, p);
      auto idx = make(ExprKind::kLiteral, pos());
      try {
        idx->literal = Value(static_cast<int64_t>(std::stoll(cur().value)));
      } catch (const std::exception&) {
        fail_at(cur(), "index too large");
      }
      next();
      e->children.push_back(std::move(node));
      e->children.push_back(std::move(idx));
      return bounded(std::move(e));
    }
    fail_at(cur(), "expected name or number");
  }
  next();  // [
  std::vector<ExprPtr> args;
  while (!is_op("]")) {
    if (!args.empty()) {
      expect_op(",");
      if (is_op("]")) break;
    }
    args.push_back(parse_subscribed());
  }
  // jinja2 emits a slice inside a tuple index (x[1:2, 0]) as Python source that does not compile: the
  // template fails to load. A slice is only ever the whole index here.
  if (args.size() > 1 &&
      std::any_of(args.begin(), args.end(), [](const ExprPtr& a) { return a->kind == ExprKind::kSlice; }))
    fail_at(cur(), "invalid syntax: a slice inside a tuple index");
  next();
  ExprPtr index;
  if (args.size() == 1) {
    index = std::move(args[0]);
  } else {
    index = make(ExprKind::kTuple, p);
    index->children = std::move(args);
  }
  if (index->kind == ExprKind::kSlice) {
    index->children.insert(index->children.begin(), std::move(node));
    return bounded(std::move(index));
  }
  auto e = make(ExprKind::kGetitem, p);
  e->children.push_back(std::move(node));
  e->children.push_back(std::move(index));
  return bounded(std::move(e));
}

ExprPtr Parser::parse_subscribed() {
  const SrcPos p = pos();
  std::vector<ExprPtr> parts;
  if (is_op(":")) {
    next();
    parts.push_back(nullptr);
  } else {
    ExprPtr node = parse_expression(true);
    if (!is_op(":")) return node;
    next();
    parts.push_back(std::move(node));
  }
  if (is_op(":")) {
    parts.push_back(nullptr);
  } else if (!is_op("]") && !is_op(",")) {
    parts.push_back(parse_expression(true));
  } else {
    parts.push_back(nullptr);
  }
  if (is_op(":")) {
    next();
    if (!is_op("]") && !is_op(",")) {
      parts.push_back(parse_expression(true));
    } else {
      parts.push_back(nullptr);
    }
  } else {
    parts.push_back(nullptr);
  }
  auto e = make(ExprKind::kSlice, p);
  e->children = std::move(parts);
  return e;
}

void Parser::parse_call_args(Expr& e) {
  expect_op("(");
  bool first = true;
  while (!is_op(")")) {
    if (!first) {
      expect_op(",");
      if (is_op(")")) break;
    }
    first = false;
    if (cur().type == TokenType::kName && peek().type == TokenType::kOperator && peek().value == "=") {
      std::string key = cur().value;
      next();
      next();
      e.kwargs.emplace_back(std::move(key), parse_expression(true));
    } else {
      if (!e.kwargs.empty())
        fail_at(cur(), "Invalid argument syntax: positional argument follows keyword argument");
      e.children.push_back(parse_expression(true));
    }
  }
  next();
}

ExprPtr Parser::parse_call(ExprPtr node) {
  auto e = make(ExprKind::kCall, pos());
  e->children.push_back(std::move(node));
  parse_call_args(*e);
  return bounded(std::move(e));
}

ExprPtr Parser::parse_filter(ExprPtr node, bool start_inline) {
  while (is_op("|") || start_inline) {
    if (!start_inline) next();
    start_inline = false;
    const Token& nt = cur();
    auto e = make(ExprKind::kFilter, pos());
    e->name = expect_name();
    while (is_op(".")) {
      next();
      e->name.push_back('.');
      e->name.append(expect_name());
    }
    if (!has_filter(e->name) && !soft_) fail_at(nt, fmt::format("No filter named '{}'.", e->name));
    e->children.push_back(std::move(node));
    if (is_op("(")) parse_call_args(*e);
    node = bounded(std::move(e));
  }
  return node;
}

ExprPtr Parser::parse_test(ExprPtr node) {
  const SrcPos p = pos();
  next();  // is
  bool negated = false;
  if (is_name("not")) {
    next();
    negated = true;
  }
  const Token& nt = cur();
  auto e = make(ExprKind::kTest, p);
  e->name = expect_name();
  while (is_op(".")) {
    next();
    e->name.push_back('.');
    e->name.append(expect_name());
  }
  if (!has_test(e->name) && !soft_) fail_at(nt, fmt::format("No test named '{}'.", e->name));
  e->children.push_back(std::move(node));
  const TokenType tt = cur().type;
  if (is_op("(")) {
    parse_call_args(*e);
  } else if ((tt == TokenType::kName || tt == TokenType::kString || tt == TokenType::kInteger ||
              tt == TokenType::kFloat || is_op("(") || is_op("[") || is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) fail_at(cur(), "You cannot chain multiple tests with is");
    e->children.push_back(parse_postfix(parse_primary()));
  }
  if (!negated) return bounded(std::move(e));
  auto n = make(ExprKind::kNot, p);
  n->children.push_back(bounded(std::move(e)));
  return bounded(std::move(n));
}

}  // namespace dsaserve::chat::detail
