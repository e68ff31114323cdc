#pragma once
// Value: the dynamic type the Jinja interpreter computes with. It mirrors the Python objects jinja2 sees
// when transformers renders a chat template: undefined, None, bool, int, float, str, list/tuple, dict
// (insertion ordered), namespace and callables. Lists and dicts are shared by reference like in Python.
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace dsaserve::chat {

class Value;

// Python list or tuple (tuple only changes how it prints).
struct ListData {
  std::vector<Value> items;
  bool tuple = false;
  mutable int depth = -1;  // value_depth's memo (lists do not change once a template holds them)
};

// Python dict (insertion ordered) or jinja2 namespace() object.
struct DictData {
  std::vector<std::pair<Value, Value>> items;
  bool is_namespace = false;
  mutable int depth = -1;  // value_depth's memo for dicts (never for namespaces: they change)

  const Value* find(const Value& key) const;
  Value* find(const Value& key);
  void set(const Value& key, Value value);
};

// Arguments of a call: positional then keyword, in call order.
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

using NativeFunction = std::function<Value(CallArgs&)>;

struct FunctionData {
  std::string name;
  NativeFunction fn;
  std::shared_ptr<DictData> attributes;  // optional: a callable with attributes (recursive `loop`)
};

// jinja2's default Undefined: prints as '', is falsy, iterates as empty; most other uses raise.
struct Undefined {
  std::string hint;     // what was looked up, for error messages ("'x' is undefined")
  bool unsafe = false;  // sandbox: an attribute that may not be used (using it is a security error)
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() : v_(Undefined{}) {}
  static Value undefined(std::string hint = {}) { return Value(Storage(Undefined{std::move(hint), false})); }
  // The sandbox's answer for a forbidden attribute: prints as '', raises a security error when used.
  static Value unsafe_attribute(std::string hint) { return Value(Storage(Undefined{std::move(hint), true})); }
  static Value none() { return Value(Storage(std::monostate{})); }
  Value(bool b) : v_(b) {}
  Value(int i) : v_(int64_t{i}) {}
  Value(int64_t i) : v_(i) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  static Value list(std::vector<Value> items = {}, bool tuple = false);
  static Value dict();
  static Value namespace_object();
  static Value function(std::string name, NativeFunction fn, std::shared_ptr<DictData> attributes = nullptr);
  // Converts parsed JSON (objects keep their key order).
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_tuple() const { return is_list() && list_data().tuple; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return is_dict() && dict_data().is_namespace; }
  bool is_function() const { return kind() == Kind::kFunction; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  // Number as double (bool -> 0/1).
  double to_double() const;
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(v_).hint; }
  bool is_unsafe_attribute() const { return is_undefined() && std::get<Undefined>(v_).unsafe; }
  ListData& list_data() const { return *std::get<std::shared_ptr<ListData>>(v_); }
  DictData& dict_data() const { return *std::get<std::shared_ptr<DictData>>(v_); }
  const FunctionData& function_data() const { return *std::get<std::shared_ptr<FunctionData>>(v_); }
  std::vector<Value>& items() const { return list_data().items; }

  // Python truthiness.
  bool truthy() const;
  // Python str(x) (undefined -> ""), and repr(x).
  std::string str() const;
  std::string repr() const;
  // Python type name for error messages ("str", "int", "dict", ...).
  std::string type_name() const;
  // Same object (Python `is`): identity for containers, value equality for scalars.
  bool same_as(const Value& other) const;

 private:
  using Storage =
      std::variant<Undefined, std::monostate, bool, int64_t, double, std::string, std::shared_ptr<ListData>,
                   std::shared_ptr<DictData>, std::shared_ptr<FunctionData>>;
  explicit Value(Storage s) : v_(std::move(s)) {}
  Storage v_;
};

// Python == between values (1 == 1.0 == True, deep for containers).
bool values_equal(const Value& a, const Value& b);
// Python < ordering; throws (TypeError-like) for incomparable kinds.
bool values_less(const Value& a, const Value& b);

// How deeply values may nest: lists, dicts and namespaces in one another. Only a namespace's attributes can
// grow a value from one loop iteration to the next, so the renderer checks what it assigns to them; the walks
// that enter namespaces (repr, to_json), where a namespace may hold itself, stop at this depth too (Python's
// RecursionError). Bounded depth keeps every walk, comparison and destruction off the end of the stack.
inline constexpr int kMaxValueDepth = 256;
// The containers nested in `v` (0 for a scalar, 1 for [1, 2]), up to kMaxValueDepth + 1 (= too deep).
int value_depth(const Value& v);

// Python repr() of a float ("1.0", "1e-05", "1e+16", "inf").
std::string python_float_repr(double d);
// Python repr() of a str ('a', "it's", with escapes).
std::string python_string_repr(const std::string& s);

// json.dumps as transformers' tojson calls it.
struct JsonDumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // nullopt: single line; "" or spaces: pretty printed
  bool sort_keys = false;
  std::optional<std::pair<std::string, std::string>> separators;  // (item, key)
};
std::string json_dumps(const Value& v, const JsonDumpOptions& options);
// Value -> nlohmann JSON (undefined/functions are errors).
nlohmann::ordered_json to_json(const Value& v);

// UTF-8 helpers: code points of a string and back.
std::u32string utf8_decode(const std::string& s);
std::string utf8_encode(const std::u32string& s);
void utf8_append(std::string& out, char32_t c);

}  // namespace dsaserve::chat
