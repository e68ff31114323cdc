#pragma once
// The recursive-descent parser behind parse_template (internal to the chat module): statements in
// parser.cpp, expressions in parser_expr.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

#include "chat/ast.h"
#include "chat/lexer.h"
#include "chat/template_error.h"

namespace dsaserve::chat::detail {

inline std::string describe(const Token& t) {
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
  Body subparse(std::initializer_list<const char*> stop);

  StmtPtr parse_statement();

  StmtPtr parse_if();

  StmtPtr parse_for();

  StmtPtr parse_set();

  void parse_signature(Stmt& s);

  StmtPtr parse_macro();

  StmtPtr parse_call_block();

  StmtPtr parse_filter_block();

  StmtPtr parse_with();

  // name | name.attr (with_namespace) | tuple of names
  ExprPtr parse_assign_target(bool with_namespace, std::initializer_list<const char*> extra_end);

  bool is_end_name(std::initializer_list<const char*> extra_end) const {
    if (cur().type != TokenType::kName) return false;
    for (const char* n : extra_end) {
      if (cur().value == n) return true;
    }
    return false;
  }

  // ---- expressions ----

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, std::initializer_list<const char*> extra_end,
                      bool explicit_parentheses);

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr();

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

  ExprPtr parse_or();

  ExprPtr parse_and();

  ExprPtr parse_not();

  ExprPtr parse_compare();

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

  ExprPtr parse_concat();

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

  ExprPtr parse_pow();

  ExprPtr parse_unary(bool with_filter);

  ExprPtr parse_primary();

  ExprPtr parse_postfix(ExprPtr node);

  ExprPtr parse_filter_expr(ExprPtr node);

  ExprPtr parse_subscript(ExprPtr node);

  ExprPtr parse_subscribed();

  void parse_call_args(Expr& e);

  ExprPtr parse_call(ExprPtr node);

  ExprPtr parse_filter(ExprPtr node, bool start_inline);

  ExprPtr parse_test(ExprPtr node);

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

}  // namespace dsaserve::chat::detail
