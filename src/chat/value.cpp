#include "chat/value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "chat/template_error.h"
#include "chat/text_util.h"

namespace dsaserve::chat {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kSyntax: return "syntax";
    case ErrorKind::kUndefined: return "undefined";
    case ErrorKind::kRuntime: return "runtime";
    case ErrorKind::kRaised: return "raised";
    case ErrorKind::kSecurity: return "security";
  }
  return "runtime";
}

TemplateError::TemplateError(ErrorKind kind, int line, int column, const std::string& message)
    : dsaserve::Error(fmt::format("template line {} column {}: {}", line, column, message)),
      kind_(kind),
      line_(line),
      column_(column),
      bare_(message) {}

void throw_value_error(ErrorKind kind, std::string message) { throw ValueError{kind, std::move(message)}; }

// ---- dict ----

const Value* DictData::find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (values_equal(k, key) && k.is_string() == key.is_string()) return &v;
  }
  return nullptr;
}

Value* DictData::find(const Value& key) {
  return const_cast<Value*>(static_cast<const DictData*>(this)->find(key));
}

void DictData::set(const Value& key, Value value) {
  if (Value* slot = find(key)) {
    *slot = std::move(value);
  } else {
    items.emplace_back(key, std::move(value));
  }
}

// ---- construction ----

Value Value::list(std::vector<Value> items, bool tuple) {
  auto d = std::make_shared<ListData>();
  d->items = std::move(items);
  d->tuple = tuple;
  return Value(Storage(std::move(d)));
}

Value Value::dict() { return Value(Storage(std::make_shared<DictData>())); }

Value Value::namespace_object() {
  auto d = std::make_shared<DictData>();
  d->is_namespace = true;
  return Value(Storage(std::move(d)));
}

Value Value::function(std::string name, NativeFunction fn, std::shared_ptr<DictData> attributes) {
  auto f = std::make_shared<FunctionData>();
  f->name = std::move(name);
  f->fn = std::move(fn);
  f->attributes = std::move(attributes);
  return Value(Storage(std::move(f)));
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return none();
    case nlohmann::json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value d = dict();
      auto& data = d.dict_data();
      for (auto it = j.begin(); it != j.end(); ++it)
        data.items.emplace_back(Value(it.key()), from_json(it.value()));
      return d;
    }
    default: return none();
  }
}

double Value::to_double() const {
  switch (kind()) {
    case Kind::kBool: return as_bool() ? 1.0 : 0.0;
    case Kind::kInt: return static_cast<double>(as_int());
    case Kind::kFloat: return as_float();
    default: throw_value_error(ErrorKind::kRuntime, fmt::format("'{}' is not a number", type_name()));
  }
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return as_bool();
    case Kind::kInt: return as_int() != 0;
    case Kind::kFloat: return as_float() != 0.0;
    case Kind::kString: return !as_string().empty();
    case Kind::kList: return !items().empty();
    case Kind::kDict: return is_namespace() || !dict_data().items.empty();
    case Kind::kFunction: return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return is_tuple() ? "tuple" : "list";
    case Kind::kDict: return is_namespace() ? "Namespace" : "dict";
    case Kind::kFunction: return "function";
  }
  return "object";
}

bool Value::same_as(const Value& other) const {
  if (kind() != other.kind()) return false;
  switch (kind()) {
    case Kind::kList: return &list_data() == &other.list_data();
    case Kind::kDict: return &dict_data() == &other.dict_data();
    case Kind::kFunction: return &function_data() == &other.function_data();
    default: return values_equal(*this, other);
  }
}

// ---- printing ----

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci: [-]D[.DDD]e[+-]XX
  bool neg = false;
  size_t p = 0;
  if (sci[0] == '-') {
    neg = true;
    p = 1;
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t i = p; i < e; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  const int exp10 = std::stoi(sci.substr(e + 1));
  const int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  std::string out = neg ? "-" : "";
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out += digits.substr(1);
    }
    out += fmt::format("e{}{:02d}", exp10 < 0 ? '-' : '+', std::abs(exp10));
  } else if (decpt <= 0) {
    out += "0.";
    out += std::string(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (static_cast<size_t>(decpt) >= digits.size()) {
    out += digits;
    out += std::string(static_cast<size_t>(decpt) - digits.size(), '0');
    out += ".0";
  } else {
    out += digits.substr(0, static_cast<size_t>(decpt));
    out += '.';
    out += digits.substr(static_cast<size_t>(decpt));
  }
  return out;
}

std::string python_string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

std::string Value::str() const {
  switch (kind()) {
    case Kind::kUndefined: return "";
    case Kind::kString: return as_string();
    default: return repr();
  }
}

namespace {

[[noreturn]] void too_deep(const char* what) {
  throw_value_error(ErrorKind::kRuntime, fmt::format("maximum recursion depth exceeded while {}", what));
}

std::string repr_at(const Value& v, int depth) {
  using Kind = Value::Kind;
  if (depth > kMaxValueDepth) too_deep("getting the repr of an object");
  switch (v.kind()) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "None";
    case Kind::kBool: return v.as_bool() ? "True" : "False";
    case Kind::kInt: return std::to_string(v.as_int());
    case Kind::kFloat: return python_float_repr(v.as_float());
    case Kind::kString: return python_string_repr(v.as_string());
    case Kind::kList: {
      const auto& l = v.list_data();
      std::string out = l.tuple ? "(" : "[";
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        out += repr_at(l.items[i], depth + 1);
      }
      if (l.tuple && l.items.size() == 1) out += ",";
      out += l.tuple ? ")" : "]";
      return out;
    }
    case Kind::kDict: {
      std::string out = v.is_namespace() ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, e] : v.dict_data().items) {
        if (!first) out += ", ";
        first = false;
        out += repr_at(k, depth + 1);
        out += ": ";
        out += repr_at(e, depth + 1);
      }
      out += v.is_namespace() ? "}>" : "}";
      return out;
    }
    case Kind::kFunction: return fmt::format("<function {}>", v.function_data().name);
  }
  return "";
}

}  // namespace

std::string Value::repr() const { return repr_at(*this, 0); }

int value_depth(const Value& v) {
  // Explicit stack of (container, next child) so that the walk itself never recurses.
  if (!v.is_list() && !v.is_dict()) return 0;
  struct Level {
    const Value* v;
    size_t next;
    int deepest;  // deepest child seen so far
  };
  std::vector<Level> stack{{&v, 0, 0}};
  auto memo = [](const Value& c) -> int& { return c.is_list() ? c.list_data().depth : c.dict_data().depth; };
  while (!stack.empty()) {
    Level& top = stack.back();
    const Value& c = *top.v;
    const size_t n = c.is_list() ? c.items().size() : c.dict_data().items.size() * 2;
    if (top.next == n) {
      const int d = std::min(top.deepest + 1, kMaxValueDepth + 1);
      if (!c.is_namespace()) memo(c) = d;
      stack.pop_back();
      if (stack.empty()) return d;
      stack.back().deepest = std::max(stack.back().deepest, d);
      continue;
    }
    const size_t i = top.next++;
    const Value& child = c.is_list()
                             ? c.items()[i]
                             : (i % 2 ? c.dict_data().items[i / 2].second : c.dict_data().items[i / 2].first);
    if (!child.is_list() && !child.is_dict()) continue;
    if (!child.is_namespace() && memo(child) >= 0) {
      top.deepest = std::max(top.deepest, memo(child));
      continue;
    }
    if (stack.size() > size_t(kMaxValueDepth)) return kMaxValueDepth + 1;  // (a namespace may hold itself)
    stack.push_back({&child, 0, 0});
  }
  return 0;
}

// ---- comparison ----

bool values_equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() == b.to_double();
    const int64_t x = a.is_bool() ? (a.as_bool() ? 1 : 0) : a.as_int();
    const int64_t y = b.is_bool() ? (b.as_bool() ? 1 : 0) : b.as_int();
    return x == y;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone: return true;
    case K::kString: return a.as_string() == b.as_string();
    case K::kList: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const auto& x = a.items();
      const auto& y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!values_equal(x[i], y[i])) return false;
      }
      return true;
    }
    case K::kDict: {
      if (a.is_namespace() || b.is_namespace()) return &a.dict_data() == &b.dict_data();
      const auto& x = a.dict_data().items;
      if (x.size() != b.dict_data().items.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* o = b.dict_data().find(k);
        if (!o || !values_equal(v, *o)) return false;
      }
      return true;
    }
    case K::kFunction: return &a.function_data() == &b.function_data();
    default: return false;
  }
}

bool values_less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() < b.to_double();
    const int64_t x = a.is_bool() ? (a.as_bool() ? 1 : 0) : a.as_int();
    const int64_t y = b.is_bool() ? (b.as_bool() ? 1 : 0) : b.as_int();
    return x < y;
  }
  if (a.is_string() && b.is_string()) {
    // Code point order equals UTF-8 byte order.
    return a.as_string() < b.as_string();
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!values_equal(x[i], y[i])) return values_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  throw_value_error(ErrorKind::kRuntime, fmt::format("'<' not supported between instances of '{}' and '{}'",
                                                     a.type_name(), b.type_name()));
}

// ---- UTF-8 ----

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::u32string utf8_decode(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = 0;
    char32_t cp = 0;
    if (c < 0x80) {
      cp = c;
      n = 1;
    } else if ((c >> 5) == 0x6) {
      cp = c & 0x1F;
      n = 2;
    } else if ((c >> 4) == 0xE) {
      cp = c & 0x0F;
      n = 3;
    } else if ((c >> 3) == 0x1E) {
      cp = c & 0x07;
      n = 4;
    } else {
      out += static_cast<char32_t>(0xFFFD);
      ++i;
      continue;
    }
    if (i + static_cast<size_t>(n) > s.size()) {
      out += static_cast<char32_t>(0xFFFD);
      break;
    }
    for (int k = 1; k < n; ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) & 0x3F);
    out += cp;
    i += static_cast<size_t>(n);
  }
  return out;
}

std::string utf8_encode(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

// ---- JSON ----

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  if (!ensure_ascii) {
    out += json_escape(s);
  } else {
    for (char32_t c : utf8_decode(s)) {
      switch (c) {
        case U'"': out += "\\\""; break;
        case U'\\': out += "\\\\"; break;
        case U'\n': out += "\\n"; break;
        case U'\r': out += "\\r"; break;
        case U'\t': out += "\\t"; break;
        case U'\b': out += "\\b"; break;
        case U'\f': out += "\\f"; break;
        default:
          if (c >= 0x20 && c <= 0x7e) {
            out += static_cast<char>(c);
          } else if (c < 0x10000) {
            out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
          } else {
            const uint32_t v = static_cast<uint32_t>(c) - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          }
      }
    }
  }
  out += '"';
}

std::string json_key(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::kString: return k.as_string();
    case Value::Kind::kBool: return k.as_bool() ? "true" : "false";
    case Value::Kind::kNone: return "null";
    case Value::Kind::kInt: return std::to_string(k.as_int());
    case Value::Kind::kFloat: return python_float_repr(k.as_float());
    default:
      throw_value_error(ErrorKind::kRuntime,
                        fmt::format("keys must be str, int, float, bool or None, not {}", k.type_name()));
  }
}

void dump(std::string& out, const Value& v, const JsonDumpOptions& o, const std::string& item_sep,
          const std::string& key_sep, int depth) {
  auto newline = [&](int d) {
    out += '\n';
    for (int i = 0; i < d; ++i) out += *o.indent;
  };
  switch (v.kind()) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: {
      const double d = v.as_float();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        out += python_float_repr(d);
      }
      return;
    }
    case Value::Kind::kString: json_string(out, v.as_string(), o.ensure_ascii); return;
    case Value::Kind::kList: {
      const auto& items = v.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        if (o.indent) newline(depth + 1);
        dump(out, items[i], o, item_sep, key_sep, depth + 1);
      }
      if (o.indent) newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.is_namespace())
        throw_value_error(ErrorKind::kRuntime, "Object of type Namespace is not JSON serializable");
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [k, val] : v.dict_data().items) entries.emplace_back(json_key(k), &val);
      if (entries.empty()) {
        out += "{}";
        return;
      }
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += item_sep;
        if (o.indent) newline(depth + 1);
        json_string(out, entries[i].first, o.ensure_ascii);
        out += key_sep;
        dump(out, *entries[i].second, o, item_sep, key_sep, depth + 1);
      }
      if (o.indent) newline(depth);
      out += '}';
      return;
    }
    case Value::Kind::kUndefined:
      throw_value_error(ErrorKind::kRuntime, "Object of type Undefined is not JSON serializable");
    case Value::Kind::kFunction:
      throw_value_error(ErrorKind::kRuntime, "Object of type function is not JSON serializable");
  }
}

}  // namespace

std::string json_dumps(const Value& v, const JsonDumpOptions& options) {
  std::string item_sep = options.indent ? "," : ", ";
  std::string key_sep = ": ";
  if (options.separators) {
    item_sep = options.separators->first;
    key_sep = options.separators->second;
  }
  std::string out;
  dump(out, v, options, item_sep, key_sep, 0);
  return out;
}

namespace {

nlohmann::ordered_json to_json_at(const Value& v, int depth) {
  if (depth > kMaxValueDepth) too_deep("converting a value to JSON");
  switch (v.kind()) {
    case Value::Kind::kNone: return nullptr;
    case Value::Kind::kBool: return v.as_bool();
    case Value::Kind::kInt: return v.as_int();
    case Value::Kind::kFloat: return v.as_float();
    case Value::Kind::kString: return v.as_string();
    case Value::Kind::kList: {
      auto arr = nlohmann::ordered_json::array();
      for (const auto& e : v.items()) arr.push_back(to_json_at(e, depth + 1));
      return arr;
    }
    case Value::Kind::kDict: {
      auto obj = nlohmann::ordered_json::object();
      for (const auto& [k, e] : v.dict_data().items) obj[k.str()] = to_json_at(e, depth + 1);
      return obj;
    }
    default:
      throw_value_error(ErrorKind::kRuntime, fmt::format("{} is not JSON serializable", v.type_name()));
  }
}

}  // namespace

nlohmann::ordered_json to_json(const Value& v) { return to_json_at(v, 0); }

}  // namespace dsaserve::chat
