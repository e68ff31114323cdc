#include "chat/template.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <unordered_map>
#include <unordered_set>

#include "chat/builtins.h"
#include "chat/lexer.h"
#include "chat/parser.h"

namespace dsaserve::chat {
namespace {

using Frame = std::unordered_map<std::string, Value>;
using Scopes = std::vector<std::shared_ptr<Frame>>;

enum class Flow { kNormal, kBreak, kContinue };

int64_t as_index(const Value& v) { return v.is_bool() ? (v.as_bool() ? 1 : 0) : v.as_int(); }
bool is_integral(const Value& v) { return v.is_int() || v.is_bool(); }

// Python floor division and modulo.
// Integers are 64-bit here (Python's are unbounded): a result that does not fit is a template error, never
// undefined behaviour.
[[noreturn]] void int_overflow(const std::string& op) {
  throw_value_error(ErrorKind::kRuntime, fmt::format("integer overflow in '{}' (integers are 64-bit)", op));
}
int64_t checked_add(int64_t a, int64_t b, const std::string& op) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) int_overflow(op);
  return r;
}
int64_t checked_sub(int64_t a, int64_t b, const std::string& op) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) int_overflow(op);
  return r;
}
int64_t checked_mul(int64_t a, int64_t b, const std::string& op) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) int_overflow(op);
  return r;
}
// base ** e (e >= 0) by squaring: at most ~64 steps whatever e is.
int64_t checked_pow(int64_t base, int64_t e) {
  if (base == 0 || base == 1) return e == 0 ? 1 : base;
  if (base == -1) return e % 2 == 0 ? 1 : -1;
  int64_t r = 1;
  while (e > 0) {
    if (e & 1) r = checked_mul(r, base, "**");
    e >>= 1;
    if (e > 0) base = checked_mul(base, base, "**");
  }
  return r;
}

int64_t floor_div(int64_t a, int64_t b) {
  if (a == INT64_MIN && b == -1) int_overflow("//");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Value binary_arith(const std::string& op, const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  auto type_error = [&]() -> Value {
    throw_value_error(ErrorKind::kRuntime, fmt::format("unsupported operand type(s) for {}: '{}' and '{}'",
                                                       op, a.type_name(), b.type_name()));
  };
  if (op == "+") {
    if (a.is_number() && b.is_number()) {
      if (is_integral(a) && is_integral(b)) return Value(checked_add(as_index(a), as_index(b), op));
      return Value(a.to_double() + b.to_double());
    }
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      std::vector<Value> items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(items), a.is_tuple());
    }
    return type_error();
  }
  if (op == "*") {
    if (a.is_number() && b.is_number()) {
      if (is_integral(a) && is_integral(b)) return Value(checked_mul(as_index(a), as_index(b), op));
      return Value(a.to_double() * b.to_double());
    }
    const Value* seq = is_integral(b) ? &a : is_integral(a) ? &b : nullptr;
    const Value* count = seq == &a ? &b : &a;
    if (seq && (seq->is_string() || seq->is_list())) {
      const int64_t n = std::max<int64_t>(0, as_index(*count));
      const size_t unit = seq->is_string() ? seq->as_string().size() : seq->items().size();
      if (unit != 0 && static_cast<uint64_t>(n) > (uint64_t{64} << 20) / unit) {
        throw_value_error(ErrorKind::kRuntime, "repetition result is too large (over 64 MiB)");
      }
      if (seq->is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq->as_string();
        return Value(std::move(out));
      }
      std::vector<Value> items;
      for (int64_t i = 0; i < n; ++i) items.insert(items.end(), seq->items().begin(), seq->items().end());
      return Value::list(std::move(items), seq->is_tuple());
    }
    return type_error();
  }
  if (op == "%" && a.is_string()) return Value(percent_format(a.as_string(), b));
  if (!a.is_number() || !b.is_number()) return type_error();
  if (op == "-") {
    if (is_integral(a) && is_integral(b)) return Value(checked_sub(as_index(a), as_index(b), op));
    return Value(a.to_double() - b.to_double());
  }
  if (op == "/") {
    if (b.to_double() == 0.0) throw_value_error(ErrorKind::kRuntime, "division by zero");
    return Value(a.to_double() / b.to_double());
  }
  if (op == "//" || op == "%") {
    if (b.to_double() == 0.0) throw_value_error(ErrorKind::kRuntime, "integer division or modulo by zero");
    if (is_integral(a) && is_integral(b)) {
      const int64_t x = as_index(a), y = as_index(b);
      if (op == "//") return Value(floor_div(x, y));
      if (y == -1) return Value(int64_t{0});  // (INT64_MIN % -1 is undefined in C++)
      int64_t m = x % y;                      // Python's sign: the divisor's
      if (m != 0 && (m < 0) != (y < 0)) m += y;
      return Value(m);
    }
    const double x = a.to_double(), y = b.to_double();
    if (op == "//") return Value(std::floor(x / y));
    double m = std::fmod(x, y);
    if (m != 0.0) {
      if ((m < 0) != (y < 0)) m += y;
    } else {
      m = std::copysign(0.0, y);  // Python: a zero remainder takes the divisor's sign
    }
    return Value(m);
  }
  if (op == "**") {
    if (is_integral(a) && is_integral(b) && as_index(b) >= 0) {
      return Value(checked_pow(as_index(a), as_index(b)));
    }
    if (a.to_double() == 0.0 && b.to_double() < 0) {
      throw_value_error(ErrorKind::kRuntime, "0.0 cannot be raised to a negative power");
    }
    return Value(std::pow(a.to_double(), b.to_double()));
  }
  return type_error();
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return values_equal(a, b);
  if (op == "!=") return !values_equal(a, b);
  if (op == "in") return contains(b, a);
  if (op == "notin") return !contains(b, a);
  if (a.is_undefined() || b.is_undefined()) require_defined(a.is_undefined() ? a : b);
  if (op == "<") return values_less(a, b);
  if (op == ">") return values_less(b, a);
  if (op == "<=") return values_less(a, b) || values_equal(a, b);
  if (op == ">=") return values_less(b, a) || values_equal(a, b);
  throw_value_error(ErrorKind::kRuntime, "unknown comparison " + op);
}

class Renderer {
 public:
  Renderer(const TemplateOptions& o, const Value& context) : o_(o) {
    auto globals = std::make_shared<Frame>();
    Value g = Value::dict();
    add_globals(g.dict_data(), o_);
    for (auto& [k, v] : g.dict_data().items) (*globals)[k.as_string()] = v;
    if (context.is_dict()) {
      for (const auto& [k, v] : context.dict_data().items) (*globals)[k.str()] = v;
    } else if (!context.is_undefined() && !context.is_none()) {
      throw_value_error(ErrorKind::kRuntime, "template context must be a dict");
    }
    scopes_.push_back(std::move(globals));
    scopes_.push_back(std::make_shared<Frame>());
  }
  // A macro stored in a frame its closure captured is a reference cycle (frame -> macro -> closure ->
  // frame) that would keep every frame it reaches alive, the globals with the whole context among them:
  // emptying the captured frames when the render ends breaks every such cycle.
  // A namespace given an attribute may hold itself or head a chain of namespaces as long as the loop that
  // built it: emptying each one (they stay alive in mutated_ meanwhile) breaks the cycles and frees the chain
  // one link at a time instead of by recursion.
  ~Renderer() {
    for (const std::shared_ptr<Frame>& f : captured_) f->clear();
    for (const Value& ns : mutated_) ns.dict_data().items.clear();
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  std::string run(const Body& body) {
    std::string out;
    exec_body(body, out);
    return out;
  }

 private:
  [[noreturn]] static void fail(ErrorKind k, SrcPos p, const std::string& msg) {
    throw TemplateError(k, p.line, p.column, msg);
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = (*it)->find(name);
      if (f != (*it)->end()) return f->second;
    }
    return Value::undefined(fmt::format("'{}' is undefined", name));
  }

  // ---- statements ----

  Flow exec_body(const Body& body, std::string& out) {
    for (const StmtPtr& s : body) {
      const Flow f = exec(*s, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow exec(const Stmt& s, std::string& out) {
    switch (s.kind) {
      case StmtKind::kText:
        out += s.text;
        charge_at(s.pos, int64_t(s.text.size()));
        return Flow::kNormal;
      case StmtKind::kOutput: {
        const Value v = eval(*s.expr);
        const size_t before = out.size();
        out += v.str();
        charge_at(s.pos, int64_t(out.size() - before));
        return Flow::kNormal;
      }
      case StmtKind::kIf:
        for (size_t i = 0; i < s.conds.size(); ++i) {
          if (eval(*s.conds[i]).truthy()) return exec_body(s.bodies[i], out);
        }
        return exec_body(s.else_body, out);
      case StmtKind::kFor: return exec_for(s, out);
      case StmtKind::kSet: assign(*s.target, eval(*s.expr), s.pos); return Flow::kNormal;
      case StmtKind::kSetBlock: {
        std::string captured;
        exec_body(s.body, captured);
        Value v(std::move(captured));
        if (s.filter) v = eval_filter_chain(*s.filter, v);
        assign(*s.target, v, s.pos);
        return Flow::kNormal;
      }
      case StmtKind::kMacro:
        scopes_.back()->insert_or_assign(s.name, make_macro(s, s.name));
        return Flow::kNormal;
      case StmtKind::kCallBlock: {
        Value caller = make_macro(s, "caller");
        out += call_expr(*s.expr, &caller).str();
        return Flow::kNormal;
      }
      case StmtKind::kFilterBlock: {
        std::string captured;
        const Flow f = exec_body(s.body, captured);
        Value v(std::move(captured));
        out += eval_filter_chain(*s.filter, v).str();
        return f;
      }
      case StmtKind::kWith: {
        auto frame = std::make_shared<Frame>();
        std::vector<Value> values;
        for (const auto& e : s.values) values.push_back(eval(*e));
        scopes_.push_back(frame);
        for (size_t i = 0; i < s.targets.size(); ++i) assign(*s.targets[i], values[i], s.pos);
        const Flow f = exec_body(s.body, out);
        scopes_.pop_back();
        return f;
      }
      case StmtKind::kBreak: return Flow::kBreak;
      case StmtKind::kContinue: return Flow::kContinue;
      case StmtKind::kScope: return exec_body(s.body, out);
    }
    return Flow::kNormal;
  }

  void assign(const Expr& target, const Value& v, SrcPos pos) {
    if (target.kind == ExprKind::kName) {
      scopes_.back()->insert_or_assign(target.name, v);
      return;
    }
    if (target.kind == ExprKind::kGetattr) {
      const Value ns = lookup(target.children[0]->name);
      if (!ns.is_namespace())
        fail(ErrorKind::kRuntime, pos, "cannot assign attribute on non-namespace object");
      // The one place a value can grow from one iteration to the next (ns.x = [ns.x]), or hold itself.
      if (value_depth(v) >= kMaxValueDepth)
        fail(ErrorKind::kRuntime, pos, fmt::format("value nests more than {} levels deep", kMaxValueDepth));
      if (mutated_seen_.insert(&ns.dict_data()).second) mutated_.push_back(ns);
      ns.dict_data().set(Value(target.name), v);
      return;
    }
    // tuple unpacking
    std::vector<Value> items;
    try {
      items = iterate(v);
    } catch (const ValueError& e) {
      fail(e.kind, pos, e.message);
    }
    const size_t n = target.children.size();
    if (items.size() != n) {
      fail(ErrorKind::kRuntime, pos,
           items.size() > n
               ? fmt::format("too many values to unpack (expected {})", n)
               : fmt::format("not enough values to unpack (expected {}, got {})", n, items.size()));
    }
    for (size_t i = 0; i < n; ++i) assign(*target.children[i], items[i], pos);
  }

  Flow exec_for(const Stmt& s, std::string& out) { return exec_loop(s, eval(*s.expr), 0, out); }

  // One run of a for loop over `iterable` (depth0 > 0 for the inner runs of a recursive loop).
  Flow exec_loop(const Stmt& s, const Value& iterable, int depth0, std::string& out) {
    std::vector<Value> items;
    try {
      items = iterate(iterable);
    } catch (const ValueError& e) {
      fail(e.kind, s.expr->pos, e.message);
    }
    if (s.filter) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        scopes_.push_back(std::make_shared<Frame>());
        assign(*s.target, item, s.pos);
        const bool keep = eval(*s.filter).truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec_body(s.else_body, out);
    const auto n = static_cast<int64_t>(items.size());
    auto last_changed = std::make_shared<std::optional<Value>>();
    for (int64_t i = 0; i < n; ++i) {
      charge_at(s.pos, 64);
      auto frame = std::make_shared<Frame>();
      auto d = std::make_shared<DictData>();
      auto& li = d->items;
      li.reserve(13);
      auto put = [&li](const char* k, Value v) { li.emplace_back(Value(k), std::move(v)); };
      put("index", Value(i + 1));
      put("index0", Value(i));
      put("revindex", Value(n - i));
      put("revindex0", Value(n - i - 1));
      put("first", Value(i == 0));
      put("last", Value(i == n - 1));
      put("length", Value(n));
      put("depth", Value(depth0 + 1));
      put("depth0", Value(depth0));
      put("previtem",
          i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item"));
      put("nextitem",
          i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item"));
      put("cycle", Value::function("cycle", [i](CallArgs& a) -> Value {
            if (a.args.empty()) throw_value_error(ErrorKind::kRuntime, "no items for cycling given");
            return a.args[static_cast<size_t>(i) % a.args.size()];
          }));
      put("changed", Value::function("changed", [last_changed](CallArgs& a) -> Value {
            Value cur = Value::list(a.args);
            if (*last_changed && values_equal(**last_changed, cur)) return Value(false);
            *last_changed = cur;
            return Value(true);
          }));
      Value loop;
      if (s.recursive) {
        // loop(children) renders the loop body over `children` one level deeper.
        Renderer* self = this;
        const Stmt* stmt = &s;
        loop = Value::function(
            "loop",
            [self, stmt, depth0](CallArgs& a) -> Value {
              const CallDepth depth(self);
              if (a.args.size() != 1 || !a.kwargs.empty()) {
                throw_value_error(ErrorKind::kRuntime, "loop() takes exactly one argument");
              }
              std::string inner;
              self->exec_loop(*stmt, a.args[0], depth0 + 1, inner);
              return Value(std::move(inner));
            },
            d);
      } else {
        loop = Value::dict();
        loop.dict_data() = std::move(*d);
      }
      frame->insert_or_assign("loop", loop);
      scopes_.push_back(frame);
      assign(*s.target, items[static_cast<size_t>(i)], s.pos);
      const Flow f = exec_body(s.body, out);
      scopes_.pop_back();
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  // A macro (or the caller of a call block) as a callable value; it sees the scopes where it was defined.
  Value make_macro(const Stmt& s, const std::string& name) {
    Scopes closure = scopes_;
    captured_.insert(captured_.end(), closure.begin(), closure.end());
    const Stmt* def = &s;
    Renderer* self = this;
    return Value::function(name, [self, closure, def, name](CallArgs& a) -> Value {
      const CallDepth depth(self);
      auto frame = std::make_shared<Frame>();
      Scopes saved = std::move(self->scopes_);
      self->scopes_ = closure;
      self->scopes_.push_back(frame);
      struct Restore {
        Renderer* r;
        Scopes* s;
        ~Restore() { r->scopes_ = std::move(*s); }
      } restore{self, &saved};
      const size_t np = def->params.size();
      std::vector<Value> varargs;
      for (size_t i = 0; i < a.args.size(); ++i) {
        if (i < np) {
          frame->insert_or_assign(def->params[i], a.args[i]);
        } else {
          varargs.push_back(a.args[i]);
        }
      }
      Value kwargs = Value::dict();
      for (auto& [k, v] : a.kwargs) {
        if (k == "caller") {
          frame->insert_or_assign("caller", v);
          continue;
        }
        auto it = std::find(def->params.begin(), def->params.end(), k);
        if (it == def->params.end()) {
          kwargs.dict_data().set(Value(k), v);
        } else if (static_cast<size_t>(it - def->params.begin()) < a.args.size()) {
          throw_value_error(ErrorKind::kRuntime,
                            fmt::format("macro '{}' got multiple values for argument '{}'", name, k));
        } else {
          frame->insert_or_assign(k, v);
        }
      }
      for (size_t i = 0; i < np; ++i) {
        if (frame->count(def->params[i])) continue;
        if (def->defaults[i]) {
          frame->insert_or_assign(def->params[i], self->eval(*def->defaults[i]));
        } else {
          frame->insert_or_assign(def->params[i], Value::undefined(fmt::format(
                                                      "parameter '{}' was not provided", def->params[i])));
        }
      }
      frame->insert_or_assign("varargs", Value::list(std::move(varargs), true));
      frame->insert_or_assign("kwargs", kwargs);
      std::string out;
      self->exec_body(def->body, out);
      return Value(std::move(out));
    });
  }

  void charge_at(SrcPos pos, int64_t bytes) {
    try {
      charge(bytes);
    } catch (const ValueError& err) {
      fail(err.kind, pos, err.message);
    }
  }

  // ---- expressions ----

  Value eval(const Expr& e) {
    try {
      Value v = eval_inner(e);
      if (v.is_string()) charge(int64_t(v.as_string().size()));  // strings are values: each result a copy
      return v;
    } catch (const ValueError& err) {
      fail(err.kind, e.pos, err.message);
    }
  }

  // Counts work against TemplateOptions::max_work_bytes.
  void charge(int64_t bytes) {
    work_ += bytes;
    if (work_ > o_.max_work_bytes) {
      throw_value_error(
          ErrorKind::kRuntime,
          fmt::format("the template did more than {} MiB of string work (one that grows a string "
                      "per message, over a very long conversation?)",
                      o_.max_work_bytes >> 20));
    }
  }

  CallArgs eval_args(const Expr& e, size_t first) {
    CallArgs a;
    for (size_t i = first; i < e.children.size(); ++i) a.args.push_back(eval(*e.children[i]));
    for (const auto& [k, v] : e.kwargs) a.kwargs.emplace_back(k, eval(*v));
    return a;
  }

  Value eval_filter(const Expr& e, const Value* operand) {
    const Value v = operand ? *operand : eval(*e.children[0]);
    CallArgs a = eval_args(e, 1);
    try {
      return apply_filter(e.name, v, a, o_);
    } catch (const ValueError& err) {
      fail(err.kind, e.pos, err.message);
    }
  }

  // A filter expression whose innermost operand is null (the {% filter %} / set-block form).
  Value eval_filter_chain(const Expr& e, const Value& operand) {
    if (!e.children[0]) return eval_filter(e, &operand);
    Value inner = eval_filter_chain(*e.children[0], operand);
    return eval_filter(e, &inner);
  }

  Value call_expr(const Expr& e, const Value* caller) {
    const Value fn = eval(*e.children[0]);
    CallArgs a = eval_args(e, 1);
    if (caller) a.kwargs.emplace_back("caller", *caller);
    require_defined(fn);
    if (!fn.is_function())
      throw_value_error(ErrorKind::kRuntime, fmt::format("'{}' object is not callable", fn.type_name()));
    return fn.function_data().fn(a);
  }

  Value eval_inner(const Expr& e) {
    switch (e.kind) {
      case ExprKind::kLiteral: return e.literal;
      case ExprKind::kName: return lookup(e.name);
      case ExprKind::kList:
      case ExprKind::kTuple: {
        std::vector<Value> items;
        items.reserve(e.children.size());
        for (const auto& c : e.children) items.push_back(eval(*c));
        return Value::list(std::move(items), e.kind == ExprKind::kTuple);
      }
      case ExprKind::kDict: {
        Value d = Value::dict();
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          d.dict_data().set(eval(*e.children[i]), eval(*e.children[i + 1]));
        }
        return d;
      }
      case ExprKind::kGetattr: {
        const Value obj = eval(*e.children[0]);
        return get_attribute(obj, e.name, o_);
      }
      case ExprKind::kGetitem: {
        const Value obj = eval(*e.children[0]);
        return get_item(obj, eval(*e.children[1]), o_);
      }
      case ExprKind::kSlice: {
        const Value obj = eval(*e.children[0]);
        auto part = [&](size_t i) { return e.children[i] ? eval(*e.children[i]) : Value::none(); };
        return get_slice(obj, part(1), part(2), part(3));
      }
      case ExprKind::kCall: return call_expr(e, nullptr);
      case ExprKind::kFilter: return eval_filter(e, nullptr);
      case ExprKind::kTest: {
        const Value v = eval(*e.children[0]);
        CallArgs a = eval_args(e, 1);
        return Value(apply_test(e.name, v, a));
      }
      case ExprKind::kNot: return Value(!eval(*e.children[0]).truthy());
      case ExprKind::kNeg:
      case ExprKind::kPos: {
        const Value v = eval(*e.children[0]);
        require_defined(v);
        if (!v.is_number()) {
          throw_value_error(ErrorKind::kRuntime,
                            fmt::format("bad operand type for unary {}: '{}'",
                                        e.kind == ExprKind::kNeg ? '-' : '+', v.type_name()));
        }
        if (e.kind == ExprKind::kPos) return v.is_bool() ? Value(as_index(v)) : v;
        return is_integral(v) ? Value(checked_sub(0, as_index(v), "-")) : Value(-v.as_float());
      }
      case ExprKind::kBinary: {
        if (e.name == "and") {
          Value l = eval(*e.children[0]);
          return l.truthy() ? eval(*e.children[1]) : l;
        }
        if (e.name == "or") {
          Value l = eval(*e.children[0]);
          return l.truthy() ? l : eval(*e.children[1]);
        }
        const Value l = eval(*e.children[0]);
        const Value r = eval(*e.children[1]);
        if (e.name == "~") return Value(l.str() + r.str());
        return binary_arith(e.name, l, r);
      }
      case ExprKind::kCompare: {
        Value left = eval(*e.children[0]);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.children[i + 1]);
          if (!compare(e.ops[i], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case ExprKind::kCondExpr: {
        if (eval(*e.children[0]).truthy()) return eval(*e.children[1]);
        if (e.children[2]) return eval(*e.children[2]);
        return Value::undefined(
            "the inline if-expression evaluated to false and no else section was defined");
      }
    }
    return Value();
  }

  // Bounds macro and recursive-loop nesting like Python's recursion limit.
  struct CallDepth {
    explicit CallDepth(Renderer* r) : renderer(r) {
      if (++renderer->call_depth_ > kMaxCallDepth) {
        --renderer->call_depth_;
        throw_value_error(ErrorKind::kRuntime, "maximum recursion depth exceeded");
      }
    }
    ~CallDepth() { --renderer->call_depth_; }
    CallDepth(const CallDepth&) = delete;
    CallDepth& operator=(const CallDepth&) = delete;
    Renderer* renderer;
  };
  static constexpr int kMaxCallDepth = 200;

  const TemplateOptions& o_;
  Scopes scopes_;
  Scopes captured_;             // every frame a macro closure captured (cleared by the destructor)
  std::vector<Value> mutated_;  // every namespace an attribute was set on (likewise)
  std::unordered_set<const DictData*> mutated_seen_;  // ... once each
  int call_depth_ = 0;
  int64_t work_ = 0;  // against TemplateOptions::max_work_bytes
};

}  // namespace

Template::Template(const std::string& source, TemplateOptions options) : options_(std::move(options)) {
  LexerOptions lo;
  lo.trim_blocks = options_.trim_blocks;
  lo.lstrip_blocks = options_.lstrip_blocks;
  lo.keep_trailing_newline = options_.keep_trailing_newline;
  body_ = std::make_shared<const Body>(parse_template(tokenize(source, lo)));
}

std::string Template::render(const Value& context) const {
  try {
    Renderer r(options_, context);
    return r.run(*body_);
  } catch (const ValueError& e) {
    throw TemplateError(e.kind, 0, 0, e.message);
  }
}

std::string Template::render(const nlohmann::ordered_json& context) const {
  return render(Value::from_json(context));
}

}  // namespace dsaserve::chat
