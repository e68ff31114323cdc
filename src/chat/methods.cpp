// Attribute, item and slice access, iteration, Python str/list/dict methods and the global functions.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <ctime>

#include "chat/builtins.h"
#include "chat/template.h"
#include "chat/template_error.h"
#include "chat/text_util.h"

namespace dsaserve::chat {

void require_defined(const Value& v) {
  if (v.is_undefined()) {
    if (v.is_unsafe_attribute()) throw_value_error(ErrorKind::kSecurity, v.undefined_hint());
    throw_value_error(ErrorKind::kUndefined,
                      v.undefined_hint().empty() ? "value is undefined" : v.undefined_hint());
  }
}

std::u32string code_points(const std::string& s) { return utf8_decode(s); }

std::vector<Value> bind_args(const char* fname, CallArgs& args, std::initializer_list<Param> params) {
  std::vector<Value> out;
  const size_t np = params.size();
  if (args.args.size() > np) {
    throw_value_error(ErrorKind::kRuntime, fmt::format("{}() takes at most {} argument(s) ({} given)", fname,
                                                       np, args.args.size()));
  }
  size_t i = 0;
  for (const Param& p : params) {
    const Value* found = i < args.args.size() ? &args.args[i] : nullptr;
    for (const auto& [k, v] : args.kwargs) {
      if (k == p.name) {
        if (found)
          throw_value_error(ErrorKind::kRuntime,
                            fmt::format("{}() got multiple values for argument '{}'", fname, k));
        found = &v;
      }
    }
    if (!found && p.required)
      throw_value_error(ErrorKind::kRuntime,
                        fmt::format("{}() missing required argument '{}'", fname, p.name));
    out.push_back(found ? *found : p.def);
    ++i;
  }
  for (const auto& [k, v] : args.kwargs) {
    bool known = false;
    for (const Param& p : params) known = known || k == p.name;
    if (!known)
      throw_value_error(ErrorKind::kRuntime,
                        fmt::format("{}() got an unexpected keyword argument '{}'", fname, k));
  }
  return out;
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return v.items();
    case Value::Kind::kDict:
      if (!v.is_namespace()) {
        std::vector<Value> keys;
        for (const auto& [k, val] : v.dict_data().items) keys.push_back(k);
        return keys;
      }
      break;
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (char32_t c : utf8_decode(v.as_string())) chars.emplace_back(utf8_encode(std::u32string(1, c)));
      return chars;
    }
    default: break;
  }
  throw_value_error(ErrorKind::kRuntime, fmt::format("'{}' object is not iterable", v.type_name()));
}

int64_t length_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return static_cast<int64_t>(utf8_decode(v.as_string()).size());
    case Value::Kind::kList: return static_cast<int64_t>(v.items().size());
    case Value::Kind::kDict:
      if (!v.is_namespace()) return static_cast<int64_t>(v.dict_data().items.size());
      break;
    default: break;
  }
  throw_value_error(ErrorKind::kRuntime, fmt::format("object of type '{}' has no len()", v.type_name()));
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        throw_value_error(
            ErrorKind::kRuntime,
            fmt::format("'in <string>' requires string as left operand, not {}", item.type_name()));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      return std::any_of(container.items().begin(), container.items().end(),
                         [&](const Value& v) { return values_equal(v, item); });
    case Value::Kind::kDict:
      if (!container.is_namespace()) return container.dict_data().find(item) != nullptr;
      break;
    case Value::Kind::kUndefined: return false;
    default: break;
  }
  throw_value_error(ErrorKind::kRuntime,
                    fmt::format("argument of type '{}' is not iterable", container.type_name()));
}

namespace {

Value method(const Value& self, const char* name, NativeFunction fn) {
  (void)self;
  return Value::function(name, std::move(fn));
}

Value unsafe(const Value& obj, const std::string& name) {
  return Value::unsafe_attribute(
      fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, obj.type_name()));
}

std::vector<Value> string_prefixes(const Value& v) {
  if (v.is_string()) return {v};
  if (v.is_tuple()) return v.items();
  throw_value_error(ErrorKind::kRuntime, "startswith first arg must be str or a tuple of str");
}

Value string_method(const Value& obj, const std::string& name) {
  const std::string s = obj.as_string();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    return method(obj, "strip", [s, left, right](CallArgs& a) {
      auto p = bind_args("strip", a, {{"chars", Value::none()}});
      if (!p[0].is_none() && !p[0].is_string())
        throw_value_error(ErrorKind::kRuntime, "strip arg must be None or str");
      return Value(py_strip(s, p[0].is_none() ? nullptr : &p[0].as_string(), left, right));
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool from_right = name == "rsplit";
    return method(obj, "split", [s, from_right](CallArgs& a) {
      auto p = bind_args("split", a, {{"sep", Value::none()}, {"maxsplit", Value(-1)}});
      if (!p[0].is_none() && !p[0].is_string()) throw_value_error(ErrorKind::kRuntime, "must be str or None");
      if (!p[1].is_int()) throw_value_error(ErrorKind::kRuntime, "maxsplit must be an integer");
      std::vector<std::string> parts =
          py_split(s, p[0].is_none() ? nullptr : &p[0].as_string(), p[1].as_int(), from_right);
      std::vector<Value> out(parts.begin(), parts.end());
      return Value::list(std::move(out));
    });
  }
  if (name == "splitlines") {
    return method(obj, "splitlines", [s](CallArgs& a) {
      auto p = bind_args("splitlines", a, {{"keepends", Value(false)}});
      std::vector<std::string> parts = py_splitlines(s, p[0].truthy());
      std::vector<Value> out(parts.begin(), parts.end());
      return Value::list(std::move(out));
    });
  }
  if (name == "startswith" || name == "endswith") {
    const bool start = name == "startswith";
    return method(obj, "startswith", [s, start](CallArgs& a) {
      auto p = bind_args(start ? "startswith" : "endswith", a, {{"prefix", Value(), true}});
      for (const Value& v : string_prefixes(p[0])) {
        if (!v.is_string())
          throw_value_error(ErrorKind::kRuntime, "tuple for startswith must only contain str");
        const std::string& x = v.as_string();
        if (x.size() > s.size()) continue;
        if (start ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0)
          return Value(true);
      }
      return Value(false);
    });
  }
  if (name == "replace") {
    return method(obj, "replace", [s](CallArgs& a) {
      auto p =
          bind_args("replace", a, {{"old", Value(), true}, {"new", Value(), true}, {"count", Value(-1)}});
      if (!p[0].is_string() || !p[1].is_string())
        throw_value_error(ErrorKind::kRuntime, "replace() arguments must be str");
      return Value(py_replace(s, p[0].as_string(), p[1].as_string(), p[2].is_int() ? p[2].as_int() : -1));
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "swapcase") {
    return method(obj, "case", [s, name](CallArgs& a) {
      bind_args(name.c_str(), a, {});
      if (name == "upper") return Value(py_upper(s));
      if (name == "lower") return Value(py_lower(s));
      if (name == "title") return Value(py_title(s));
      if (name == "capitalize") return Value(py_capitalize(s));
      std::string out = s;
      for (char& c : out)
        c = (c >= 'a' && c <= 'z')   ? static_cast<char>(c - 32)
            : (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32)
                                     : c;
      return Value(out);
    });
  }
  if (name == "find" || name == "rfind" || name == "count" || name == "index" || name == "rindex") {
    return method(obj, "find", [s, name](CallArgs& a) {
      auto p = bind_args(name.c_str(), a, {{"sub", Value(), true}});
      if (!p[0].is_string()) throw_value_error(ErrorKind::kRuntime, "must be str");
      const std::string& sub = p[0].as_string();
      if (name == "count") return Value(py_count(s, sub));
      const size_t at = (name == "find" || name == "index") ? s.find(sub) : s.rfind(sub);
      if (at == std::string::npos) {
        if (name == "index" || name == "rindex")
          throw_value_error(ErrorKind::kRuntime, "substring not found");
        return Value(-1);
      }
      return Value(static_cast<int64_t>(utf8_decode(s.substr(0, at)).size()));
    });
  }
  if (name == "join") {
    return method(obj, "join", [s](CallArgs& a) {
      auto p = bind_args("join", a, {{"iterable", Value(), true}});
      std::string out;
      bool first = true;
      for (const Value& v : iterate(p[0])) {
        if (!v.is_string())
          throw_value_error(ErrorKind::kRuntime,
                            fmt::format("sequence item: expected str instance, {} found", v.type_name()));
        if (!first) out += s;
        first = false;
        out += v.as_string();
      }
      return Value(out);
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" ||
      name == "islower") {
    return method(obj, "is", [s, name](CallArgs& a) {
      bind_args(name.c_str(), a, {});
      return Value(py_is_class(s, name));
    });
  }
  return Value::undefined(fmt::format("'str object' has no attribute '{}'", name));
}

Value list_method(const Value& obj, const std::string& name, const TemplateOptions& o) {
  static const char* mutating[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"};
  for (const char* m : mutating) {
    if (name != m) continue;
    if (!o.allow_mutation || obj.is_tuple()) return unsafe(obj, name);
    if (name == "append") {
      return method(obj, "append", [obj](CallArgs& a) {
        auto p = bind_args("append", a, {{"object", Value(), true}});
        obj.items().push_back(p[0]);
        return Value::none();
      });
    }
    if (name == "extend") {
      return method(obj, "extend", [obj](CallArgs& a) {
        auto p = bind_args("extend", a, {{"iterable", Value(), true}});
        for (const Value& v : iterate(p[0])) obj.items().push_back(v);
        return Value::none();
      });
    }
    if (name == "insert") {
      return method(obj, "insert", [obj](CallArgs& a) {
        auto p = bind_args("insert", a, {{"index", Value(), true}, {"object", Value(), true}});
        auto& items = obj.items();
        int64_t i = p[0].as_int();
        const auto n = static_cast<int64_t>(items.size());
        if (i < 0) i = std::max<int64_t>(0, i + n);
        i = std::min(i, n);
        items.insert(items.begin() + i, p[1]);
        return Value::none();
      });
    }
    if (name == "pop") {
      return method(obj, "pop", [obj](CallArgs& a) {
        auto p = bind_args("pop", a, {{"index", Value(-1)}});
        auto& items = obj.items();
        if (items.empty()) throw_value_error(ErrorKind::kRuntime, "pop from empty list");
        int64_t i = p[0].as_int();
        const auto n = static_cast<int64_t>(items.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) throw_value_error(ErrorKind::kRuntime, "pop index out of range");
        Value v = items[static_cast<size_t>(i)];
        items.erase(items.begin() + i);
        return v;
      });
    }
    return method(obj, "mutate", [obj, name](CallArgs& a) {
      auto& items = obj.items();
      if (name == "clear") {
        bind_args("clear", a, {});
        items.clear();
      } else if (name == "reverse") {
        bind_args("reverse", a, {});
        std::reverse(items.begin(), items.end());
      } else if (name == "sort") {
        auto p = bind_args("sort", a, {{"reverse", Value(false)}});
        std::stable_sort(items.begin(), items.end(), values_less);
        if (p[0].truthy()) std::reverse(items.begin(), items.end());
      } else {
        auto p = bind_args("remove", a, {{"value", Value(), true}});
        auto it =
            std::find_if(items.begin(), items.end(), [&](const Value& v) { return values_equal(v, p[0]); });
        if (it == items.end()) throw_value_error(ErrorKind::kRuntime, "list.remove(x): x not in list");
        items.erase(it);
      }
      return Value::none();
    });
  }
  if (name == "index" || name == "count") {
    return method(obj, "index", [obj, name](CallArgs& a) {
      auto p = bind_args(name.c_str(), a, {{"value", Value(), true}});
      int64_t count = 0;
      const auto& items = obj.items();
      for (size_t i = 0; i < items.size(); ++i) {
        if (!values_equal(items[i], p[0])) continue;
        if (name == "index") return Value(static_cast<int64_t>(i));
        ++count;
      }
      if (name == "index") throw_value_error(ErrorKind::kRuntime, "value is not in list");
      return Value(count);
    });
  }
  if (name == "copy" && !obj.is_tuple()) {
    return method(obj, "copy", [obj](CallArgs& a) {
      bind_args("copy", a, {});
      return Value::list(obj.items());
    });
  }
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", obj.type_name(), name));
}

Value dict_method(const Value& obj, const std::string& name, const TemplateOptions& o, bool* found) {
  *found = true;
  if (name == "items" || name == "keys" || name == "values") {
    return method(obj, "items", [obj, name](CallArgs& a) {
      bind_args(name.c_str(), a, {});
      std::vector<Value> out;
      for (const auto& [k, v] : obj.dict_data().items) {
        if (name == "items") {
          out.push_back(Value::list({k, v}, true));
        } else {
          out.push_back(name == "keys" ? k : v);
        }
      }
      return Value::list(std::move(out));
    });
  }
  if (name == "get") {
    return method(obj, "get", [obj](CallArgs& a) {
      auto p = bind_args("get", a, {{"key", Value(), true}, {"default", Value::none()}});
      const Value* v = obj.dict_data().find(p[0]);
      return v ? *v : p[1];
    });
  }
  if (name == "copy") {
    return method(obj, "copy", [obj](CallArgs& a) {
      bind_args("copy", a, {});
      Value d = Value::dict();
      d.dict_data().items = obj.dict_data().items;
      return d;
    });
  }
  if (name == "pop" || name == "update" || name == "setdefault" || name == "clear" || name == "popitem") {
    if (!o.allow_mutation) return unsafe(obj, name);
    if (name == "update") {
      return method(obj, "update", [obj](CallArgs& a) {
        if (a.args.size() > 1) throw_value_error(ErrorKind::kRuntime, "update expected at most 1 argument");
        if (!a.args.empty()) {
          if (!a.args[0].is_dict())
            throw_value_error(ErrorKind::kRuntime, "update() argument must be a dict");
          for (const auto& [k, v] : a.args[0].dict_data().items) obj.dict_data().set(k, v);
        }
        for (const auto& [k, v] : a.kwargs) obj.dict_data().set(Value(k), v);
        return Value::none();
      });
    }
    if (name == "pop") {
      return method(obj, "pop", [obj](CallArgs& a) {
        auto p = bind_args("pop", a, {{"key", Value(), true}, {"default", Value::undefined("__missing__")}});
        auto& items = obj.dict_data().items;
        for (auto it = items.begin(); it != items.end(); ++it) {
          if (values_equal(it->first, p[0])) {
            Value v = it->second;
            items.erase(it);
            return v;
          }
        }
        if (p[1].is_undefined())
          throw_value_error(ErrorKind::kRuntime, fmt::format("KeyError: {}", p[0].repr()));
        return p[1];
      });
    }
    if (name == "setdefault") {
      return method(obj, "setdefault", [obj](CallArgs& a) {
        auto p = bind_args("setdefault", a, {{"key", Value(), true}, {"default", Value::none()}});
        if (const Value* v = obj.dict_data().find(p[0])) return *v;
        obj.dict_data().set(p[0], p[1]);
        return p[1];
      });
    }
    return unsafe(obj, name);
  }
  *found = false;
  return Value();
}

}  // namespace

Value get_attribute(const Value& obj, const std::string& name, const TemplateOptions& o) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined: require_defined(obj); break;
    case Value::Kind::kString: return string_method(obj, name);
    case Value::Kind::kList: return list_method(obj, name, o);
    case Value::Kind::kDict: {
      if (obj.is_namespace()) {
        if (const Value* v = obj.dict_data().find(Value(name))) return *v;
        return Value::undefined(fmt::format("'Namespace object' has no attribute '{}'", name));
      }
      bool found = false;
      Value m = dict_method(obj, name, o, &found);
      if (found) return m;
      if (const Value* v = obj.dict_data().find(Value(name))) return *v;
      return Value::undefined(fmt::format("'dict object' has no attribute '{}'", name));
    }
    case Value::Kind::kFunction:
      if (const auto& attrs = obj.function_data().attributes) {
        if (const Value* v = attrs->find(Value(name))) return *v;
      }
      break;
    default: break;
  }
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", obj.repr(), name));
}

Value get_item(const Value& obj, const Value& key, const TemplateOptions& o) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined: require_defined(obj); break;
    case Value::Kind::kDict:
      if (!obj.is_namespace()) {
        if (const Value* v = obj.dict_data().find(key)) return *v;
        if (key.is_string()) {
          bool found = false;
          Value m = dict_method(obj, key.as_string(), o, &found);
          if (found) return m;
        }
        return Value::undefined(fmt::format("'dict object' has no attribute {}", key.repr()));
      }
      break;
    case Value::Kind::kList:
    case Value::Kind::kString: {
      if (key.is_int() || key.is_bool()) {
        int64_t i = key.is_bool() ? (key.as_bool() ? 1 : 0) : key.as_int();
        if (obj.is_list()) {
          const auto n = static_cast<int64_t>(obj.items().size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return obj.items()[static_cast<size_t>(i)];
        } else {
          const std::u32string cps = utf8_decode(obj.as_string());
          const auto n = static_cast<int64_t>(cps.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return Value(utf8_encode(cps.substr(static_cast<size_t>(i), 1)));
        }
        return Value::undefined(fmt::format("{} object has no element {}", obj.type_name(), key.repr()));
      }
      if (key.is_string()) return get_attribute(obj, key.as_string(), o);
      break;
    }
    default: break;
  }
  return Value::undefined(fmt::format("{} object has no element {}", obj.type_name(), key.repr()));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  require_defined(obj);
  if (!obj.is_list() && !obj.is_string()) {
    throw_value_error(ErrorKind::kRuntime, fmt::format("'{}' object is not subscriptable", obj.type_name()));
  }
  auto as_opt = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (v.is_int()) return v.as_int();
    if (v.is_bool()) return v.as_bool() ? 1 : 0;
    throw_value_error(ErrorKind::kRuntime, "slice indices must be integers or None");
  };
  const int64_t st = as_opt(step).value_or(1);
  if (st == 0) throw_value_error(ErrorKind::kRuntime, "slice step cannot be zero");
  const std::u32string cps = obj.is_string() ? utf8_decode(obj.as_string()) : std::u32string();
  const auto n = static_cast<int64_t>(obj.is_string() ? cps.size() : obj.items().size());
  auto clamp = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0) x += n;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(as_opt(start), st > 0 ? 0 : n - 1);
  const int64_t e = clamp(as_opt(stop), st > 0 ? n : -1);
  std::vector<size_t> idx;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) idx.push_back(static_cast<size_t>(i));
  if (obj.is_string()) {
    std::u32string out;
    for (size_t i : idx) out += cps[i];
    return Value(utf8_encode(out));
  }
  std::vector<Value> out;
  for (size_t i : idx) out.push_back(obj.items()[i]);
  return Value::list(std::move(out), obj.is_tuple());
}

std::string percent_format(const std::string& format, const Value& args) {
  std::vector<Value> values;
  const bool is_tuple = args.is_tuple();
  if (is_tuple) {
    values = args.items();
  } else {
    values.push_back(args);
  }
  // Python lets a non-tuple argument with __getitem__ (dict, list, str) go unused.
  const bool may_be_unused = !is_tuple && (args.is_dict() || args.is_list() || args.is_string());
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    if (++i >= format.size()) throw_value_error(ErrorKind::kRuntime, "incomplete format");
    const Value* mapped = nullptr;
    if (format[i] == '(') {
      const size_t close = format.find(')', i);
      if (close == std::string::npos) throw_value_error(ErrorKind::kRuntime, "incomplete format key");
      if (!args.is_dict()) throw_value_error(ErrorKind::kRuntime, "format requires a mapping");
      mapped = args.dict_data().find(Value(format.substr(i + 1, close - i - 1)));
      if (!mapped) throw_value_error(ErrorKind::kRuntime, "KeyError: " + format.substr(i + 1, close - i - 1));
      used_mapping = true;
      i = close + 1;
    }
    std::string spec = "%";
    while (i < format.size() && std::strchr("-+ 0#", format[i])) spec += format[i++];
    while (i < format.size() && std::isdigit(static_cast<unsigned char>(format[i]))) spec += format[i++];
    if (i < format.size() && format[i] == '.') {
      spec += format[i++];
      while (i < format.size() && std::isdigit(static_cast<unsigned char>(format[i]))) spec += format[i++];
    }
    if (i >= format.size()) throw_value_error(ErrorKind::kRuntime, "incomplete format");
    const char conv = format[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (!mapped && next >= values.size())
      throw_value_error(ErrorKind::kRuntime, "not enough arguments for format string");
    const Value& v = mapped ? *mapped : values[next++];
    char buf[512];
    switch (conv) {
      case 's':
      case 'r': {
        const std::string text = conv == 's' ? v.str() : v.repr();
        spec += 's';
        std::snprintf(buf, sizeof(buf), spec.c_str(), text.c_str());
        out += text.size() < 400 ? std::string(buf) : text;
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o': {
        if (!v.is_number())
          throw_value_error(ErrorKind::kRuntime, fmt::format("%{} format: a real number is required, not {}",
                                                             conv, v.type_name()));
        const long long n =
            v.is_float() ? static_cast<long long>(v.as_float()) : static_cast<long long>(v.to_double());
        spec += "ll";
        spec += conv == 'i' ? 'd' : conv;
        std::snprintf(buf, sizeof(buf), spec.c_str(), n);
        out += buf;
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G': {
        if (!v.is_number())
          throw_value_error(ErrorKind::kRuntime, fmt::format("must be real number, not {}", v.type_name()));
        spec += conv;
        std::snprintf(buf, sizeof(buf), spec.c_str(), v.to_double());
        out += buf;
        break;
      }
      default: throw_value_error(ErrorKind::kRuntime, fmt::format("unsupported format character '{}'", conv));
    }
  }
  if (!used_mapping && next < values.size() && !(may_be_unused && next == 0)) {
    throw_value_error(ErrorKind::kRuntime, "not all arguments converted during string formatting");
  }
  return out;
}

void add_globals(DictData& g, const TemplateOptions& o) {
  g.set(Value("range"), Value::function("range", [](CallArgs& a) {
          if (!a.kwargs.empty() || a.args.empty() || a.args.size() > 3) {
            throw_value_error(ErrorKind::kRuntime, "range expected 1 to 3 integer arguments");
          }
          for (const Value& v : a.args) {
            if (!v.is_int() && !v.is_bool()) {
              throw_value_error(
                  ErrorKind::kRuntime,
                  fmt::format("'{}' object cannot be interpreted as an integer", v.type_name()));
            }
          }
          auto iv = [&](size_t i) {
            return a.args[i].is_bool() ? int64_t{a.args[i].as_bool()} : a.args[i].as_int();
          };
          int64_t start = 0, stop, step = 1;
          if (a.args.size() == 1) {
            stop = iv(0);
          } else {
            start = iv(0);
            stop = iv(1);
            if (a.args.size() == 3) step = iv(2);
          }
          if (step == 0) throw_value_error(ErrorKind::kRuntime, "range() arg 3 must not be zero");
          std::vector<Value> out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (out.size() >= 100000)
              throw_value_error(ErrorKind::kRuntime,
                                "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
            out.emplace_back(i);
          }
          return Value::list(std::move(out));
        }));
  g.set(Value("dict"), Value::function("dict", [](CallArgs& a) {
          Value d = Value::dict();
          if (a.args.size() > 1) throw_value_error(ErrorKind::kRuntime, "dict expected at most 1 argument");
          if (!a.args.empty()) {
            if (a.args[0].is_dict()) {
              d.dict_data().items = a.args[0].dict_data().items;
            } else {
              for (const Value& pair : iterate(a.args[0])) {
                auto kv = iterate(pair);
                if (kv.size() != 2)
                  throw_value_error(ErrorKind::kRuntime,
                                    "dictionary update sequence element has wrong length");
                d.dict_data().set(kv[0], kv[1]);
              }
            }
          }
          for (const auto& [k, v] : a.kwargs) d.dict_data().set(Value(k), v);
          return d;
        }));
  g.set(Value("namespace"), Value::function("namespace", [](CallArgs& a) {
          Value ns = Value::namespace_object();
          if (a.args.size() > 1)
            throw_value_error(ErrorKind::kRuntime, "namespace expected at most 1 argument");
          for (const Value& init : a.args) {
            require_defined(init);
            if (init.is_dict()) {
              for (const auto& [k, v] : init.dict_data().items) ns.dict_data().set(k, v);
              continue;
            }
            for (const Value& pair : iterate(init)) {
              auto kv = iterate(pair);
              if (kv.size() != 2) {
                throw_value_error(ErrorKind::kRuntime, "dictionary update sequence element has wrong length");
              }
              ns.dict_data().set(kv[0], kv[1]);
            }
          }
          for (const auto& [k, v] : a.kwargs) ns.dict_data().set(Value(k), v);
          return ns;
        }));
  g.set(Value("raise_exception"), Value::function("raise_exception", [](CallArgs& a) -> Value {
          auto p = bind_args("raise_exception", a, {{"message", Value(), true}});
          throw_value_error(ErrorKind::kRaised, p[0].str());
        }));
  auto clock = o.clock;
  g.set(Value("strftime_now"), Value::function("strftime_now", [clock](CallArgs& a) {
          auto p = bind_args("strftime_now", a, {{"format", Value(), true}});
          if (!p[0].is_string()) throw_value_error(ErrorKind::kRuntime, "strftime() argument 1 must be str");
          const std::time_t now = clock ? static_cast<std::time_t>(clock()) : std::time(nullptr);
          std::tm tm{};
          localtime_r(&now, &tm);
          char buf[512];
          const size_t n = std::strftime(buf, sizeof(buf), p[0].as_string().c_str(), &tm);
          return Value(std::string(buf, n));
        }));
}

}  // namespace dsaserve::chat
