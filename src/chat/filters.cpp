// Built-in filters and tests (jinja2 3.1 semantics; tojson is transformers' json.dumps wrapper).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <unordered_map>

#include "chat/builtins.h"
#include "chat/template.h"
#include "chat/template_error.h"
#include "chat/text_util.h"

namespace dsaserve::chat {
namespace {

using FilterFn = Value (*)(const Value&, CallArgs&, const TemplateOptions&);
using TestFn = bool (*)(const Value&, CallArgs&);

Value as_list_value(std::vector<Value> v) { return Value::list(std::move(v)); }

// attribute="a.b.0" getter of jinja2's make_attrgetter.
Value attr_path(const Value& item, const Value& attribute, const TemplateOptions& o) {
  if (attribute.is_int()) return get_item(item, attribute, o);
  Value cur = item;
  const std::string path = attribute.str();
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    // A numeric part indexes a list (up to 18 digits: past that it cannot be an index; it stays a key).
    const bool numeric = !part.empty() && part.size() <= 18 &&
                         std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = get_item(cur, numeric ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part), o);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(py_lower(v.as_string()));
  return v;
}

Value f_tojson(const Value& v, CallArgs& a, const TemplateOptions&) {
  auto p = bind_args("tojson", a,
                     {{"ensure_ascii", Value(false)},
                      {"indent", Value::none()},
                      {"separators", Value::none()},
                      {"sort_keys", Value(false)}});
  JsonDumpOptions o;
  o.ensure_ascii = p[0].truthy();
  if (p[1].is_int()) {
    o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, p[1].as_int())), ' ');
  } else if (p[1].is_string()) {
    o.indent = p[1].as_string();
  } else if (!p[1].is_none()) {
    throw_value_error(ErrorKind::kRuntime, "tojson indent must be an int or a string");
  }
  if (!p[2].is_none()) {
    auto seps = iterate(p[2]);
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string()) {
      throw_value_error(ErrorKind::kRuntime, "tojson separators must be a pair of strings");
    }
    o.separators = std::make_pair(seps[0].as_string(), seps[1].as_string());
  }
  o.sort_keys = p[3].truthy();
  return Value(json_dumps(v, o));
}

Value f_length(const Value& v, CallArgs& a, const TemplateOptions&) {
  bind_args("length", a, {});
  return Value(length_of(v));
}

Value f_first(const Value& v, CallArgs& a, const TemplateOptions&) {
  bind_args("first", a, {});
  auto items = iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(const Value& v, CallArgs& a, const TemplateOptions&) {
  bind_args("last", a, {});
  require_defined(v);
  auto items = iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_default(const Value& v, CallArgs& a, const TemplateOptions&) {
  auto p = bind_args("default", a, {{"default_value", Value("")}, {"boolean", Value(false)}});
  if (v.is_undefined() || (p[1].truthy() && !v.truthy())) return p[0];
  return v;
}

Value f_trim(const Value& v, CallArgs& a, const TemplateOptions&) {
  auto p = bind_args("trim", a, {{"chars", Value::none()}});
  return Value(py_strip(v.str(), p[0].is_none() ? nullptr : &p[0].as_string(), true, true));
}

Value f_join(const Value& v, CallArgs& a, const TemplateOptions& o) {
  auto p = bind_args("join", a, {{"d", Value("")}, {"attribute", Value::none()}});
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out += p[0].str();
    first = false;
    out += (p[1].is_none() ? item : attr_path(item, p[1], o)).str();
  }
  return Value(out);
}

Value f_upper(const Value& v, CallArgs& a, const TemplateOptions&) {
  bind_args("upper", a, {});
  return Value(py_upper(v.str()));
}
Value f_lower(const Value& v, CallArgs& a, const TemplateOptions&) {
  bind_args("lower", a, {});
  return Value(py_lower(v.str()));
}
Value f_title(const Value& v, CallArgs& a, const TemplateOptions&) {
  bind_args("title", a, {});
  return Value(jinja_title(v.str()));
}
Value f_capitalize(const Value& v, CallArgs& a, const TemplateOptions&) {
  bind_args("capitalize", a, {});
  return Value(py_capitalize(v.str()));
}

Value f_replace(const Value& v, CallArgs& a, const TemplateOptions&) {
  auto p =
      bind_args("replace", a, {{"old", Value(), true}, {"new", Value(), true}, {"count", Value::none()}});
  return Value(py_replace(v.str(), p[0].str(), p[1].str(), p[2].is_int() ? p[2].as_int() : -1));
}

Value f_items(const Value& v, CallArgs& a, const TemplateOptions&) {
  bind_args("items", a, {});
  if (v.is_undefined()) return as_list_value({});
  if (!v.is_dict() || v.is_namespace())
    throw_value_error(ErrorKind::kRuntime, "Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, val] : v.dict_data().items) out.push_back(Value::list({k, val}, true));
  return as_list_value(std::move(out));
}

Value f_list(const Value& v, CallArgs& a, const TemplateOptions&) {
  bind_args("list", a, {});
  return as_list_value(iterate(v));
}

Value f_map(const Value& v, CallArgs& a, const TemplateOptions& o) {
  std::vector<Value> out;
  if (a.args.empty()) {
    Value attribute, def = Value::undefined();
    bool has_attr = false;
    for (const auto& [k, val] : a.kwargs) {
      if (k == "attribute") {
        attribute = val;
        has_attr = true;
      } else if (k == "default") {
        def = val;
      } else {
        throw_value_error(ErrorKind::kRuntime, fmt::format("Unexpected keyword argument '{}'", k));
      }
    }
    if (!has_attr) throw_value_error(ErrorKind::kRuntime, "map requires a filter argument");
    for (const Value& item : iterate(v)) {
      Value r = attr_path(item, attribute, o);
      out.push_back(r.is_undefined() && !def.is_undefined() ? def : r);
    }
    return as_list_value(std::move(out));
  }
  if (!a.args[0].is_string()) throw_value_error(ErrorKind::kRuntime, "map filter name must be a string");
  const std::string name = a.args[0].as_string();
  if (!has_filter(name)) throw_value_error(ErrorKind::kRuntime, fmt::format("No filter named '{}'.", name));
  for (const Value& item : iterate(v)) {
    CallArgs rest;
    rest.args.assign(a.args.begin() + 1, a.args.end());
    rest.kwargs = a.kwargs;
    out.push_back(apply_filter(name, item, rest, o));
  }
  return as_list_value(std::move(out));
}

Value select_impl(const Value& v, CallArgs& a, const TemplateOptions& o, bool attr, bool want) {
  std::vector<Value> out;
  size_t next = 0;
  Value attribute;
  if (attr) {
    if (a.args.empty()) throw_value_error(ErrorKind::kRuntime, "selectattr needs an attribute name");
    attribute = a.args[next++];
  }
  std::string test;
  if (next < a.args.size()) {
    if (!a.args[next].is_string()) throw_value_error(ErrorKind::kRuntime, "test name must be a string");
    test = a.args[next++].as_string();
    if (!has_test(test)) throw_value_error(ErrorKind::kRuntime, fmt::format("No test named '{}'.", test));
  }
  for (const Value& item : iterate(v)) {
    const Value x = attr ? attr_path(item, attribute, o) : item;
    bool r;
    if (test.empty()) {
      r = x.truthy();
    } else {
      CallArgs rest;
      rest.args.assign(a.args.begin() + static_cast<std::ptrdiff_t>(next), a.args.end());
      rest.kwargs = a.kwargs;
      r = apply_test(test, x, rest);
    }
    if (r == want) out.push_back(item);
  }
  return as_list_value(std::move(out));
}

Value f_select(const Value& v, CallArgs& a, const TemplateOptions& o) {
  return select_impl(v, a, o, false, true);
}
Value f_reject(const Value& v, CallArgs& a, const TemplateOptions& o) {
  return select_impl(v, a, o, false, false);
}
Value f_selectattr(const Value& v, CallArgs& a, const TemplateOptions& o) {
  return select_impl(v, a, o, true, true);
}
Value f_rejectattr(const Value& v, CallArgs& a, const TemplateOptions& o) {
  return select_impl(v, a, o, true, false);
}

Value f_unique(const Value& v, CallArgs& a, const TemplateOptions& o) {
  auto p = bind_args("unique", a, {{"case_sensitive", Value(false)}, {"attribute", Value::none()}});
  std::vector<Value> out, seen;
  for (const Value& item : iterate(v)) {
    Value key = sort_key(p[1].is_none() ? item : attr_path(item, p[1], o), p[0].truthy());
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return values_equal(s, key); })) continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return as_list_value(std::move(out));
}

Value f_sort(const Value& v, CallArgs& a, const TemplateOptions& o) {
  auto p = bind_args(
      "sort", a, {{"reverse", Value(false)}, {"case_sensitive", Value(false)}, {"attribute", Value::none()}});
  std::vector<Value> items = iterate(v);
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items) {
    keyed.emplace_back(sort_key(p[2].is_none() ? item : attr_path(item, p[2], o), p[1].truthy()), item);
  }
  const bool rev = p[0].truthy();
  std::stable_sort(keyed.begin(), keyed.end(), [rev](const auto& x, const auto& y) {
    return rev ? values_less(y.first, x.first) : values_less(x.first, y.first);
  });
  std::vector<Value> out;
  for (auto& [k, item] : keyed) out.push_back(item);
  return as_list_value(std::move(out));
}

Value f_dictsort(const Value& v, CallArgs& a, const TemplateOptions&) {
  auto p = bind_args("dictsort", a,
                     {{"case_sensitive", Value(false)}, {"by", Value("key")}, {"reverse", Value(false)}});
  if (!v.is_dict()) throw_value_error(ErrorKind::kRuntime, "dictsort expects a mapping");
  const bool by_value = p[1].str() == "value";
  std::vector<std::pair<Value, Value>> items = v.dict_data().items;
  const bool cs = p[0].truthy(), rev = p[2].truthy();
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    const Value kx = sort_key(by_value ? x.second : x.first, cs),
                ky = sort_key(by_value ? y.second : y.first, cs);
    return rev ? values_less(ky, kx) : values_less(kx, ky);
  });
  std::vector<Value> out;
  for (auto& [k, val] : items) out.push_back(Value::list({k, val}, true));
  return as_list_value(std::move(out));
}

Value f_string(const Value& v, CallArgs& a, const TemplateOptions&) {
  bind_args("string", a, {});
  return Value(v.str());
}

bool parse_python_int(const std::string& text, int64_t base, int64_t* out) {
  std::string s = py_strip(text, nullptr, true, true);
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && std::isalnum(static_cast<unsigned char>(s[i - 1])) &&
        std::isalnum(static_cast<unsigned char>(s[i + 1]))) {
      continue;
    }
    clean += s[i];
  }
  if (clean.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long r = std::strtoll(clean.c_str(), &end, static_cast<int>(base));
  if (errno != 0 || end != clean.c_str() + clean.size()) return false;
  if (base == 10 && clean.size() > 1) {
    const size_t d = (clean[0] == '-' || clean[0] == '+') ? 1 : 0;
    if (clean.size() > d + 1 && clean[d] == '0' &&
        std::any_of(clean.begin() + static_cast<std::ptrdiff_t>(d), clean.end(),
                    [](char c) { return c != '0'; }))
      return false;
  }
  *out = r;
  return true;
}

bool parse_python_float(const std::string& text, double* out) {
  std::string s = py_lower(py_strip(text, nullptr, true, true));
  if (s.empty()) return false;
  for (char c : s) {
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == '+' || c == '-' ||
          c == 'i' || c == 'n' || c == 'f' || c == 't' || c == 'y' || c == 'a')) {
      return false;
    }
  }
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return false;
  *out = d;
  return true;
}

Value f_int(const Value& v, CallArgs& a, const TemplateOptions&) {
  auto p = bind_args("int", a, {{"default", Value(0)}, {"base", Value(10)}});
  if (v.is_int()) return v;
  if (v.is_bool()) return Value(int64_t{v.as_bool()});
  if (v.is_float()) {
    if (!std::isfinite(v.as_float())) return p[0];
    return Value(static_cast<int64_t>(std::trunc(v.as_float())));
  }
  if (v.is_string()) {
    int64_t r;
    if (parse_python_int(v.as_string(), p[1].is_int() ? p[1].as_int() : 10, &r)) return Value(r);
    double d;
    if (parse_python_float(v.as_string(), &d) && std::isfinite(d))
      return Value(static_cast<int64_t>(std::trunc(d)));
  }
  return p[0];
}

Value f_float(const Value& v, CallArgs& a, const TemplateOptions&) {
  auto p = bind_args("float", a, {{"default", Value(0.0)}});
  if (v.is_number()) return Value(v.to_double());
  double d;
  if (v.is_string() && parse_python_float(v.as_string(), &d)) return Value(d);
  return p[0];
}

Value f_round(const Value& v, CallArgs& a, const TemplateOptions&) {
  auto p = bind_args("round", a, {{"precision", Value(0)}, {"method", Value("common")}});
  const std::string m = p[1].str();
  if (m != "common" && m != "ceil" && m != "floor")
    throw_value_error(ErrorKind::kRuntime, "method must be 'common', 'ceil' or 'floor'");
  require_defined(v);
  if (!v.is_number())
    throw_value_error(ErrorKind::kRuntime,
                      fmt::format("type {} doesn't define __round__ method", v.type_name()));
  const int64_t prec = p[0].is_int() ? p[0].as_int() : 0;
  if (m == "common") {
    if (v.is_int() || v.is_bool()) return Value(v.is_bool() ? int64_t{v.as_bool()} : v.as_int());
    const double x = v.as_float();
    if (!std::isfinite(x)) return v;
    if (prec >= 0 && prec < 300) {
      std::string s = fmt::format("{:.{}f}", x, prec);  // correctly rounded, ties to even like Python
      return Value(std::strtod(s.c_str(), nullptr));
    }
    const double scale = std::pow(10.0, static_cast<double>(prec));
    return Value(std::nearbyint(x * scale) / scale);
  }
  const double scale = std::pow(10.0, static_cast<double>(prec));
  const double x = v.to_double() * scale;
  return Value((m == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value f_abs(const Value& v, CallArgs& a, const TemplateOptions&) {
  bind_args("abs", a, {});
  require_defined(v);
  if (v.is_int()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  if (v.is_bool()) return Value(int64_t{v.as_bool()});
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  throw_value_error(ErrorKind::kRuntime, fmt::format("bad operand type for abs(): '{}'", v.type_name()));
}

Value f_safe(const Value& v, CallArgs& a, const TemplateOptions&) {
  bind_args("safe", a, {});
  return Value(v.str());
}

Value f_escape(const Value& v, CallArgs& a, const TemplateOptions&) {
  bind_args("escape", a, {});
  return Value(html_escape(v.str()));
}

Value f_indent(const Value& v, CallArgs& a, const TemplateOptions&) {
  auto p = bind_args("indent", a, {{"width", Value(4)}, {"first", Value(false)}, {"blank", Value(false)}});
  const std::string ind =
      p[0].is_string()
          ? p[0].as_string()
          : std::string(static_cast<size_t>(std::max<int64_t>(0, p[0].is_int() ? p[0].as_int() : 4)), ' ');
  std::vector<std::string> lines = py_splitlines(v.str() + "\n", false);
  std::string rv;
  if (p[2].truthy()) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) {
        rv += '\n';
        rv += ind;
      }
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += '\n';
      if (!lines[i].empty()) rv += ind;
      rv += lines[i];
    }
  }
  if (p[1].truthy()) rv = ind + rv;
  return Value(rv);
}

Value f_wordcount(const Value& v, CallArgs& a, const TemplateOptions&) {
  bind_args("wordcount", a, {});
  return Value(jinja_wordcount(v.str()));
}

Value f_reverse(const Value& v, CallArgs& a, const TemplateOptions&) {
  bind_args("reverse", a, {});
  if (v.is_string()) {
    std::u32string cps = utf8_decode(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value(utf8_encode(cps));
  }
  std::vector<Value> items = iterate(v);
  std::reverse(items.begin(), items.end());
  return as_list_value(std::move(items));
}

Value f_sum(const Value& v, CallArgs& a, const TemplateOptions& o) {
  auto p = bind_args("sum", a, {{"attribute", Value::none()}, {"start", Value(0)}});
  Value acc = p[1];
  for (const Value& item : iterate(v)) {
    const Value x = p[0].is_none() ? item : attr_path(item, p[0], o);
    if (!acc.is_number() || !x.is_number()) {
      throw_value_error(ErrorKind::kRuntime, fmt::format("unsupported operand type(s) for +: '{}' and '{}'",
                                                         acc.type_name(), x.type_name()));
    }
    if (acc.is_float() || x.is_float()) {
      acc = Value(acc.to_double() + x.to_double());
    } else {
      acc = Value(static_cast<int64_t>(acc.to_double()) + static_cast<int64_t>(x.to_double()));
    }
  }
  return acc;
}

Value min_max(const Value& v, CallArgs& a, const TemplateOptions& o, bool want_max) {
  auto p = bind_args(want_max ? "max" : "min", a,
                     {{"case_sensitive", Value(false)}, {"attribute", Value::none()}});
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined(fmt::format("No aggregated item, sequence was empty."));
  size_t best = 0;
  auto key = [&](size_t i) {
    return sort_key(p[1].is_none() ? items[i] : attr_path(items[i], p[1], o), p[0].truthy());
  };
  for (size_t i = 1; i < items.size(); ++i) {
    if (want_max ? values_less(key(best), key(i)) : values_less(key(i), key(best))) best = i;
  }
  return items[best];
}
Value f_min(const Value& v, CallArgs& a, const TemplateOptions& o) { return min_max(v, a, o, false); }
Value f_max(const Value& v, CallArgs& a, const TemplateOptions& o) { return min_max(v, a, o, true); }

Value f_center(const Value& v, CallArgs& a, const TemplateOptions&) {
  auto p = bind_args("center", a, {{"width", Value(80)}});
  const std::string s = v.str();
  const int64_t len = static_cast<int64_t>(utf8_decode(s).size());
  const int64_t width = p[0].is_int() ? p[0].as_int() : 80;
  if (width <= len) return Value(s);
  const int64_t pad = width - len;
  const int64_t left = pad / 2 + (pad & width & 1);
  return Value(std::string(static_cast<size_t>(left), ' ') + s +
               std::string(static_cast<size_t>(pad - left), ' '));
}

Value f_format(const Value& v, CallArgs& a, const TemplateOptions&) {
  if (!a.kwargs.empty() && !a.args.empty())
    throw_value_error(ErrorKind::kRuntime, "can't handle positional and keyword arguments at the same time");
  if (!a.kwargs.empty()) {
    Value d = Value::dict();
    for (const auto& [k, val] : a.kwargs) d.dict_data().set(Value(k), val);
    return Value(percent_format(v.str(), d));
  }
  return Value(percent_format(v.str(), Value::list(a.args, true)));
}

Value f_attr(const Value& v, CallArgs& a, const TemplateOptions& o) {
  auto p = bind_args("attr", a, {{"name", Value(), true}});
  return get_attribute(v, p[0].str(), o);
}

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> table = {
      {"tojson", f_tojson},
      {"length", f_length},
      {"count", f_length},
      {"first", f_first},
      {"last", f_last},
      {"default", f_default},
      {"d", f_default},
      {"trim", f_trim},
      {"join", f_join},
      {"upper", f_upper},
      {"lower", f_lower},
      {"title", f_title},
      {"capitalize", f_capitalize},
      {"replace", f_replace},
      {"items", f_items},
      {"list", f_list},
      {"map", f_map},
      {"select", f_select},
      {"reject", f_reject},
      {"selectattr", f_selectattr},
      {"rejectattr", f_rejectattr},
      {"unique", f_unique},
      {"sort", f_sort},
      {"dictsort", f_dictsort},
      {"string", f_string},
      {"int", f_int},
      {"float", f_float},
      {"round", f_round},
      {"abs", f_abs},
      {"safe", f_safe},
      {"e", f_escape},
      {"escape", f_escape},
      {"indent", f_indent},
      {"wordcount", f_wordcount},
      {"reverse", f_reverse},
      {"sum", f_sum},
      {"min", f_min},
      {"max", f_max},
      {"center", f_center},
      {"attr", f_attr},
      {"format", f_format},
  };
  return table;
}

// ---- tests ----

int64_t int_of(const Value& v) {
  require_defined(v);
  if (v.is_bool()) return v.as_bool() ? 1 : 0;
  if (v.is_int()) return v.as_int();
  throw_value_error(ErrorKind::kRuntime,
                    fmt::format("unsupported operand type(s) for %: '{}' and 'int'", v.type_name()));
}

const Value& arg0(CallArgs& a, const char* test) {
  if (a.args.size() != 1 || !a.kwargs.empty())
    throw_value_error(ErrorKind::kRuntime, fmt::format("test '{}' takes one argument", test));
  return a.args[0];
}

bool t_defined(const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(const Value& v, CallArgs&) { return v.is_none(); }
bool t_string(const Value& v, CallArgs&) { return v.is_string(); }
bool t_number(const Value& v, CallArgs&) { return v.is_number(); }
bool t_integer(const Value& v, CallArgs&) { return v.is_int(); }
bool t_float(const Value& v, CallArgs&) { return v.is_float(); }
bool t_boolean(const Value& v, CallArgs&) { return v.is_bool(); }
bool t_mapping(const Value& v, CallArgs&) { return v.is_dict() && !v.is_namespace(); }
bool t_iterable(const Value& v, CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
}
bool t_sequence(const Value& v, CallArgs& a) { return t_iterable(v, a); }
bool t_callable(const Value& v, CallArgs&) { return v.is_function(); }
bool t_true(const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }
bool t_false(const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }
// value % 2 with Python semantics (floats allowed).
double mod2(const Value& v) {
  if (v.is_float()) {
    double m = std::fmod(v.as_float(), 2.0);
    if (m < 0) m += 2.0;
    return m;
  }
  return static_cast<double>(((int_of(v) % 2) + 2) % 2);
}
bool t_odd(const Value& v, CallArgs&) { return mod2(v) == 1.0; }
bool t_even(const Value& v, CallArgs&) { return mod2(v) == 0.0; }
bool t_divisibleby(const Value& v, CallArgs& a) {
  const int64_t d = int_of(arg0(a, "divisibleby"));
  if (d == 0) throw_value_error(ErrorKind::kRuntime, "integer division or modulo by zero");
  return int_of(v) % d == 0;
}
bool t_in(const Value& v, CallArgs& a) { return contains(arg0(a, "in"), v); }
bool t_eq(const Value& v, CallArgs& a) { return values_equal(v, arg0(a, "eq")); }
bool t_ne(const Value& v, CallArgs& a) { return !values_equal(v, arg0(a, "ne")); }
bool t_lt(const Value& v, CallArgs& a) { return values_less(v, arg0(a, "lt")); }
bool t_gt(const Value& v, CallArgs& a) { return values_less(arg0(a, "gt"), v); }
bool t_le(const Value& v, CallArgs& a) { return !values_less(arg0(a, "le"), v); }
bool t_ge(const Value& v, CallArgs& a) { return !values_less(v, arg0(a, "ge")); }
bool t_sameas(const Value& v, CallArgs& a) { return v.same_as(arg0(a, "sameas")); }
bool t_lower(const Value& v, CallArgs&) { return py_is_class(v.str(), "islower"); }
bool t_upper(const Value& v, CallArgs&) { return py_is_class(v.str(), "isupper"); }
bool t_escaped(const Value&, CallArgs&) { return false; }
bool t_filter(const Value& v, CallArgs&) { return v.is_string() && has_filter(v.as_string()); }
bool t_test(const Value& v, CallArgs&) { return v.is_string() && has_test(v.as_string()); }

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> table = {
      {"defined", t_defined},
      {"undefined", t_undefined},
      {"none", t_none},
      {"string", t_string},
      {"number", t_number},
      {"integer", t_integer},
      {"float", t_float},
      {"boolean", t_boolean},
      {"mapping", t_mapping},
      {"iterable", t_iterable},
      {"sequence", t_sequence},
      {"callable", t_callable},
      {"true", t_true},
      {"false", t_false},
      {"odd", t_odd},
      {"even", t_even},
      {"divisibleby", t_divisibleby},
      {"in", t_in},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"==", t_eq},
      {"ne", t_ne},
      {"!=", t_ne},
      {"lt", t_lt},
      {"lessthan", t_lt},
      {"<", t_lt},
      {"le", t_le},
      {"<=", t_le},
      {"gt", t_gt},
      {"greaterthan", t_gt},
      {">", t_gt},
      {"ge", t_ge},
      {">=", t_ge},
      {"sameas", t_sameas},
      {"lower", t_lower},
      {"upper", t_upper},
      {"escaped", t_escaped},
      {"filter", t_filter},
      {"test", t_test},
  };
  return table;
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) != 0; }
bool has_test(const std::string& name) { return tests().count(name) != 0; }

Value apply_filter(const std::string& name, const Value& operand, CallArgs& args, const TemplateOptions& o) {
  auto it = filters().find(name);
  if (it == filters().end())
    throw_value_error(ErrorKind::kSyntax, fmt::format("No filter named '{}'.", name));
  return it->second(operand, args, o);
}

bool apply_test(const std::string& name, const Value& operand, CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end())
    throw_value_error(ErrorKind::kRuntime, fmt::format("No test named '{}' found.", name));
  static const char* one_arg[] = {
      "divisibleby", "in", "eq", "equalto", "==",          "ne", "!=", "lt", "lessthan",
      "<",           "le", "<=", "gt",      "greaterthan", ">",  "ge", ">=", "sameas"};
  const bool takes_one =
      std::any_of(std::begin(one_arg), std::end(one_arg), [&](const char* n) { return name == n; });
  if (!takes_one && (!args.args.empty() || !args.kwargs.empty())) {
    throw_value_error(ErrorKind::kRuntime, fmt::format("test '{}' takes no arguments", name));
  }
  return it->second(operand, args);
}

}  // namespace dsaserve::chat
