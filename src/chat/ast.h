#pragma once
// Syntax tree of a parsed template. Nodes are immutable after parsing, so one parsed template can be
// rendered by many threads at once.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/value.h"

namespace dsaserve::chat {

struct SrcPos {
  int line = 1;
  int column = 1;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  kLiteral,   // literal
  kName,      // name
  kList,      // children
  kTuple,     // children
  kDict,      // children: key0, value0, key1, value1, ...
  kGetattr,   // children[0] . name
  kGetitem,   // children[0] [ children[1] ]
  kSlice,     // children[0] [ children[1] : children[2] : children[3] ] (null parts allowed)
  kCall,      // children[0] ( children[1..], kwargs )
  kFilter,    // name: children[0] | name(children[1..], kwargs); children[0] null inside {% filter %}
  kTest,      // name: children[0] is name(children[1..], kwargs)
  kNot,       // not children[0]
  kNeg,       // - children[0]
  kPos,       // + children[0]
  kBinary,    // children[0] op children[1]: + - * / // % ** ~ and or
  kCompare,   // children[0] ops[0] children[1] ops[1] children[2] ...: == != < <= > >= in notin
  kCondExpr,  // children[1] if children[0] else children[2] (children[2] may be null)
};

struct Expr {
  ExprKind kind;
  SrcPos pos;
  Value literal;
  std::string name;  // variable, attribute, filter, test or operator name
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // comparison operators
  int depth = 1;                 // height of this subtree (bounded by the parser)
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind {
  kText,         // text
  kOutput,       // {{ expr }}
  kIf,           // conds[i] -> bodies[i]; else_body
  kFor,          // for target in expr [if filter] [recursive]: body; else_body
  kSet,          // set target = expr
  kSetBlock,     // set target [| filter] %} body {% endset
  kMacro,        // macro name(params = defaults) body
  kCallBlock,    // call[(params)] expr: body is the caller
  kFilterBlock,  // filter expr(with null operand) body
  kWith,         // with targets = values: body
  kBreak,
  kContinue,
  kScope,  // body rendered as is (the {% generation %} tag of transformers)
};

struct Stmt {
  StmtKind kind;
  SrcPos pos;
  std::string text;
  std::string name;  // macro name
  ExprPtr expr;      // output / for iterable / set value / call expression / filter
  ExprPtr target;    // for / set target
  ExprPtr filter;    // for-loop condition, set-block filter
  bool recursive = false;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  // macro / caller parameters and defaults (null when absent); with-statement targets and values
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;
  std::vector<ExprPtr> targets;
  std::vector<ExprPtr> values;
};

}  // namespace dsaserve::chat
