#include "chat/parser.h"

#include "chat/builtins.h"
#include "chat/parser_internal.h"

namespace dsaserve::chat {
namespace detail {

Body Parser::subparse(std::initializer_list<const char*> stop) {
  const DepthGuard guard(this);
  Body body;
  while (true) {
    const Token& t = cur();
    if (t.type == TokenType::kEof) {
      if (stop.size() != 0) {
        fail_at(t, fmt::format("Unexpected end of template. Jinja was looking for the following tags: '{}'.",
                               *stop.begin()));
      }
      return body;
    }
    if (t.type == TokenType::kData) {
      auto s = make_stmt(StmtKind::kText, pos());
      s->text = t.value;
      body.push_back(std::move(s));
      next();
    } else if (t.type == TokenType::kVarBegin) {
      auto s = make_stmt(StmtKind::kOutput, pos());
      next();
      s->expr = parse_tuple(false, true, {}, false);
      if (cur().type != TokenType::kVarEnd)
        fail_at(cur(), fmt::format("expected end of print statement, got {}", describe(cur())));
      next();
      body.push_back(std::move(s));
    } else if (t.type == TokenType::kBlockBegin) {
      next();
      if (cur().type != TokenType::kName) fail_at(cur(), "tag name expected");
      for (const char* s : stop) {
        if (cur().value == s) return body;
      }
      body.push_back(parse_statement());
    } else {
      fail_at(t, fmt::format("unexpected {}", describe(t)));
    }
  }
}

StmtPtr Parser::parse_statement() {
  const Token& t = cur();
  const std::string& n = t.value;
  if (n == "if") return parse_if();
  if (n == "for") return parse_for();
  if (n == "set") return parse_set();
  if (n == "macro") return parse_macro();
  if (n == "call") return parse_call_block();
  if (n == "filter") return parse_filter_block();
  if (n == "with") return parse_with();
  if (n == "generation") {
    auto s = make_stmt(StmtKind::kScope, pos());
    next();
    expect_body_start();
    s->body = subparse({"endgeneration"});
    next();
    expect_block_end();
    return s;
  }
  if (n == "break" || n == "continue") {
    if (loop_depth_ == 0) fail_at(t, fmt::format("'{}' outside of a loop", n));
    auto s = make_stmt(n == "break" ? StmtKind::kBreak : StmtKind::kContinue, pos());
    next();
    expect_block_end();
    return s;
  }
  fail_at(t, fmt::format("Encountered unknown tag '{}'.", n));
}

StmtPtr Parser::parse_if() {
  const SoftScope soft(this, true);
  auto s = make_stmt(StmtKind::kIf, pos());
  next();
  s->conds.push_back(parse_tuple(false, false, {}, false));
  expect_body_start();
  s->bodies.push_back(subparse({"elif", "else", "endif"}));
  while (true) {
    if (is_name("elif")) {
      next();
      s->conds.push_back(parse_tuple(false, false, {}, false));
      expect_body_start();
      s->bodies.push_back(subparse({"elif", "else", "endif"}));
    } else if (is_name("else")) {
      next();
      expect_body_start();
      s->else_body = subparse({"endif"});
      next();
      expect_block_end();
      return s;
    } else {
      next();  // endif
      expect_block_end();
      return s;
    }
  }
}

StmtPtr Parser::parse_for() {
  auto s = make_stmt(StmtKind::kFor, pos());
  next();
  s->target = parse_assign_target(false, {"in"});
  if (!is_name("in")) fail_at(cur(), fmt::format("expected 'in', got {}", describe(cur())));
  next();
  s->expr = parse_tuple(false, false, {"recursive"}, false);
  if (is_name("if")) {
    next();
    s->filter = parse_expression(true);
  }
  if (is_name("recursive")) {
    next();
    s->recursive = true;
  }
  expect_body_start();
  {
    const SoftScope hard(this, false);
    ++loop_depth_;
    s->body = subparse({"endfor", "else"});
  }
  --loop_depth_;
  if (is_name("else")) {
    next();
    expect_body_start();
    s->else_body = subparse({"endfor"});
  }
  next();
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_set() {
  const SrcPos p = pos();
  next();
  ExprPtr target = parse_assign_target(true, {});
  if (is_op("=")) {
    next();
    auto s = make_stmt(StmtKind::kSet, p);
    s->target = std::move(target);
    s->expr = parse_tuple(false, true, {}, false);
    expect_block_end();
    return s;
  }
  auto s = make_stmt(StmtKind::kSetBlock, p);
  s->target = std::move(target);
  if (is_op("|")) s->filter = parse_filter(nullptr, false);
  expect_body_start();
  {
    const SoftScope hard(this, false);
    s->body = subparse({"endset"});
  }
  next();
  expect_block_end();
  return s;
}

void Parser::parse_signature(Stmt& s) {
  expect_op("(");
  while (!is_op(")")) {
    if (!s.params.empty()) expect_op(",");
    if (is_op(")")) break;
    const Token& nt = cur();
    std::string n = expect_name();
    if (std::find(s.params.begin(), s.params.end(), n) != s.params.end())
      fail_at(nt, "duplicate argument name");
    s.params.push_back(n);
    if (is_op("=")) {
      next();
      s.defaults.push_back(parse_expression(true));
    } else {
      if (std::any_of(s.defaults.begin(), s.defaults.end(), [](const ExprPtr& e) { return e != nullptr; })) {
        fail_at(nt, "non-default argument follows default argument");
      }
      s.defaults.push_back(nullptr);
    }
  }
  next();
}

StmtPtr Parser::parse_macro() {
  auto s = make_stmt(StmtKind::kMacro, pos());
  next();
  s->name = expect_name();
  parse_signature(*s);
  expect_body_start();
  const int saved = loop_depth_;
  loop_depth_ = 0;
  {
    const SoftScope hard(this, false);
    s->body = subparse({"endmacro"});
  }
  loop_depth_ = saved;
  next();
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_call_block() {
  auto s = make_stmt(StmtKind::kCallBlock, pos());
  next();
  if (is_op("(")) parse_signature(*s);
  const Token& ct = cur();
  s->expr = parse_expression(true);
  if (s->expr->kind != ExprKind::kCall) fail_at(ct, "expected call");
  expect_body_start();
  const int saved = loop_depth_;
  loop_depth_ = 0;
  {
    const SoftScope hard(this, false);
    s->body = subparse({"endcall"});
  }
  loop_depth_ = saved;
  next();
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_filter_block() {
  auto s = make_stmt(StmtKind::kFilterBlock, pos());
  next();
  s->filter = parse_filter(nullptr, true);
  expect_body_start();
  {
    const SoftScope hard(this, false);
    s->body = subparse({"endfilter"});
  }
  next();
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_with() {
  auto s = make_stmt(StmtKind::kWith, pos());
  next();
  while (cur().type != TokenType::kBlockEnd) {
    if (!s->targets.empty()) expect_op(",");
    s->targets.push_back(parse_assign_target(false, {}));
    expect_op("=");
    s->values.push_back(parse_expression(true));
  }
  expect_body_start();
  {
    const SoftScope hard(this, false);
    s->body = subparse({"endwith"});
  }
  next();
  expect_block_end();
  return s;
}

ExprPtr Parser::parse_assign_target(bool with_namespace, std::initializer_list<const char*> extra_end) {
  const SrcPos p = pos();
  std::vector<ExprPtr> names;
  bool is_tuple = false;
  bool paren = false;
  if (is_op("(")) {
    paren = true;
    next();
  }
  while (true) {
    if (!names.empty()) {
      if (!is_op(",")) break;
      next();
      is_tuple = true;
    }
    if (cur().type != TokenType::kName || is_end_name(extra_end)) break;
    auto n = make(ExprKind::kName, pos());
    n->name = expect_name();
    if (with_namespace && is_op(".")) {
      next();
      auto attr = make(ExprKind::kGetattr, n->pos);
      attr->name = expect_name();
      attr->children.push_back(std::move(n));
      names.push_back(std::move(attr));
      continue;
    }
    if (n->name == "true" || n->name == "false" || n->name == "none" || n->name == "True" ||
        n->name == "False" || n->name == "None") {
      fail_at(t_[i_ - 1], fmt::format("can't assign to '{}'", n->name));
    }
    names.push_back(std::move(n));
  }
  if (paren) {
    expect_op(")");
    is_tuple = is_tuple || names.size() != 1;
  }
  if (names.empty()) fail_at(cur(), fmt::format("expected an assignment target, got {}", describe(cur())));
  if (!is_tuple) return std::move(names[0]);
  auto t = make(ExprKind::kTuple, p);
  t->children = std::move(names);
  return t;
}

}  // namespace detail

Body parse_template(const std::vector<Token>& tokens) { return detail::Parser(tokens).parse_all(); }

}  // namespace dsaserve::chat
