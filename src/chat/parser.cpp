#include "chat/parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>

#include "chat/builtins.h"
#include "chat/template_error.h"

namespace dsaserve::chat {
namespace {

std::string describe(const Token& t) {
  switch (t.type) {
    case TokenType::kEof: return "end of template";
    case TokenType::kBlockEnd: return "end of statement block";
    case TokenType::kVarEnd: return "end of print statement";
    case TokenType::kData: return "template data";
    case TokenType::kString: return "string";
    default: return fmt::format("'{}'", t.value);
  }
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Body parse_all() {
    Body body = subparse({});
    if (cur().type != TokenType::kEof)
      fail_at(cur(), fmt::format("Encountered unknown tag '{}'.", cur().value));
    return body;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void next() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  SrcPos pos() const { return {cur().line, cur().column}; }

  [[noreturn]] void fail_at(const Token& t, const std::string& msg) const {
    throw TemplateError(ErrorKind::kSyntax, t.line, t.column, msg);
  }
  bool is_op(const char* op) const { return cur().type == TokenType::kOperator && cur().value == op; }
  bool is_name(const char* n) const { return cur().type == TokenType::kName && cur().value == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail_at(cur(), fmt::format("expected '{}', got {}", op, describe(cur())));
    next();
  }
  std::string expect_name() {
    if (cur().type != TokenType::kName)
      fail_at(cur(), fmt::format("expected a name, got {}", describe(cur())));
    std::string n = cur().value;
    next();
    return n;
  }
  // The end of a tag that opens a body; jinja2 accepts a Python-style ':' before it.
  void expect_body_start() {
    if (is_op(":")) next();
    expect_block_end();
  }
  void expect_block_end() {
    if (cur().type != TokenType::kBlockEnd)
      fail_at(cur(), fmt::format("expected end of statement block, got {}", describe(cur())));
    next();
  }

  static ExprPtr make(ExprKind k, SrcPos p) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->pos = p;
    return e;
  }
  static StmtPtr make_stmt(StmtKind k, SrcPos p) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->pos = p;
    return s;
  }

  // ---- statements ----

  // Parses until a block tag whose name is in `stop` (left current, after its {%), or end of input.
  Body subparse(std::initializer_list<const char*> stop) {
    const DepthGuard guard(this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == TokenType::kEof) {
        if (stop.size() != 0) {
          fail_at(t,
                  fmt::format("Unexpected end of template. Jinja was looking for the following tags: '{}'.",
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

  StmtPtr parse_statement() {
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

  StmtPtr parse_if() {
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

  StmtPtr parse_for() {
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

  StmtPtr parse_set() {
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

  void parse_signature(Stmt& s) {
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
        if (std::any_of(s.defaults.begin(), s.defaults.end(),
                        [](const ExprPtr& e) { return e != nullptr; })) {
          fail_at(nt, "non-default argument follows default argument");
        }
        s.defaults.push_back(nullptr);
      }
    }
    next();
  }

  StmtPtr parse_macro() {
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

  StmtPtr parse_call_block() {
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

  StmtPtr parse_filter_block() {
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

  StmtPtr parse_with() {
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

  // name | name.attr (with_namespace) | tuple of names
  ExprPtr parse_assign_target(bool with_namespace, std::initializer_list<const char*> extra_end) {
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

  bool is_end_name(std::initializer_list<const char*> extra_end) const {
    if (cur().type != TokenType::kName) return false;
    for (const char* n : extra_end) {
      if (cur().value == n) return true;
    }
    return false;
  }

  // ---- expressions ----

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, std::initializer_list<const char*> extra_end,
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
      if (!explicit_parentheses)
        fail_at(cur(), fmt::format("Expected an expression, got {}", describe(cur())));
    }
    auto t = make(ExprKind::kTuple, p);
    t->children = std::move(args);
    return bounded(std::move(t));
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
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

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, SrcPos p) {
    auto e = make(ExprKind::kBinary, p);
    e->name = op;
    e->children.push_back(std::move(l));
    e->children.push_back(std::move(r));
    return bounded(std::move(e));
  }

  // Sets the subtree height; chains built in loops (a+b+c..., a.b.c..., x|f|g...) must stay shallow
  // enough to evaluate and free recursively.
  ExprPtr bounded(ExprPtr e) {
    for (const auto& c : e->children) {
      if (c) e->depth = std::max(e->depth, c->depth + 1);
    }
    if (e->depth > kMaxDepth) fail_at(cur(), "expression nesting is too deep");
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const SrcPos p = pos();
      next();
      left = binary("or", std::move(left), parse_and(), p);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const SrcPos p = pos();
      next();
      left = binary("and", std::move(left), parse_not(), p);
    }
    return left;
  }

  ExprPtr parse_not() {
    const DepthGuard guard(this);
    if (is_name("not")) {
      auto e = make(ExprKind::kNot, pos());
      next();
      e->children.push_back(parse_not());
      return bounded(std::move(e));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
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

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const SrcPos p = pos();
      std::string op = cur().value;
      next();
      left = binary(op, std::move(left), parse_concat(), p);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const SrcPos p = pos();
      next();
      left = binary("~", std::move(left), parse_math2(), p);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const SrcPos p = pos();
      std::string op = cur().value;
      next();
      left = binary(op, std::move(left), parse_pow(), p);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const SrcPos p = pos();
      next();
      left = binary("**", std::move(left), parse_unary(true), p);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
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

  ExprPtr parse_primary() {
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
      } catch (const std::exception&) {
        e->literal = Value(std::stod(t.value));
      }
      next();
      return e;
    }
    if (t.type == TokenType::kFloat) {
      auto e = make(ExprKind::kLiteral, p);
      e->literal = Value(std::stod(t.value));
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

  ExprPtr parse_postfix(ExprPtr node) {
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

  ExprPtr parse_filter_expr(ExprPtr node) {
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

  ExprPtr parse_subscript(ExprPtr node) {
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
        idx->literal = Value(static_cast<int64_t>(std::stoll(cur().value)));
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

  ExprPtr parse_subscribed() {
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

  void parse_call_args(Expr& e) {
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

  ExprPtr parse_call(ExprPtr node) {
    auto e = make(ExprKind::kCall, pos());
    e->children.push_back(std::move(node));
    parse_call_args(*e);
    return bounded(std::move(e));
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
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

  ExprPtr parse_test(ExprPtr node) {
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

  const std::vector<Token>& t_;
  size_t i_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
  // Inside an if statement (not a nested frame) or an inline if: like jinja2's "soft" frames, an
  // unknown filter or test there is an error only when it is evaluated.
  bool soft_ = false;
  struct SoftScope {
    SoftScope(Parser* p, bool soft) : parser(p), saved(p->soft_) { parser->soft_ = soft; }
    ~SoftScope() { parser->soft_ = saved; }
    SoftScope(const SoftScope&) = delete;
    SoftScope& operator=(const SoftScope&) = delete;
    Parser* parser;
    bool saved;
  };

  // Bounds the parser's recursion (deeply nested input is an error, not a stack overflow).
  struct DepthGuard {
    explicit DepthGuard(Parser* p) : parser(p) {
      if (++parser->depth_ > kMaxDepth) parser->fail_at(parser->cur(), "template nesting is too deep");
    }
    ~DepthGuard() { --parser->depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;
    Parser* parser;
  };
  static constexpr int kMaxDepth = 400;
};

}  // namespace

Body parse_template(const std::vector<Token>& tokens) { return Parser(tokens).parse_all(); }

}  // namespace dsaserve::chat
