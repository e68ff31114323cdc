#include "server/json_body.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <unordered_map>
#include <vector>

#include "server/openai.h"

namespace dsaserve::server {

namespace {

using ojson = nlohmann::ordered_json;

// Length of the well-formed UTF-8 sequence at s[i] (RFC 3629: no overlongs, surrogates or > U+10FFFF),
// 0 when there is none.
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return uint8_t(s[i + k]); };
  const uint8_t c = b(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // the second byte's range
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(1) < lo || b(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (b(k) < 0x80 || b(k) > 0xBF) return 0;
  }
  return n;
}

// Builds the DOM from SAX events. Objects are filled by appending to ordered_map's vector (an index of
// the keys is kept per open object once it has more than a few, for duplicates: the last value wins, in
// the first one's place, as Python's json does), so the whole parse is linear in the body.
class Builder {
 public:
  Builder(const JsonLimits& limits, const std::atomic<bool>* cancel) : limits_(limits), cancel_(cancel) {}

  ojson take() { return std::move(root_); }

  bool null() { return put(ojson(nullptr)); }
  bool boolean(bool v) { return put(ojson(v)); }
  bool number_integer(ojson::number_integer_t v) { return put(ojson(v)); }
  bool number_unsigned(ojson::number_unsigned_t v) { return put(ojson(v)); }
  bool number_float(ojson::number_float_t v, const ojson::string_t&) { return put(ojson(v)); }
  bool string(ojson::string_t& v) { return put(ojson(std::move(v))); }
  bool binary(ojson::binary_t& v) { return put(ojson::binary(std::move(v))); }
  bool start_object(std::size_t) { return open(ojson::object()); }
  bool start_array(std::size_t) { return open(ojson::array()); }
  bool key(ojson::string_t& k) {
    Frame& f = frames_.back();
    if (++f.count > limits_.max_object_keys) {
      fail(fmt::format("an object of the body has more than {} keys", limits_.max_object_keys));
    }
    key_ = std::move(k);
    if (frames_.size() == 1) top_key_ = key_;
    return true;
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) {
    std::string what = ex.what();
    if (what.rfind("[json.exception.", 0) == 0) {
      if (auto e = what.find("] "); e != std::string::npos) what = what.substr(e + 2);
    }
    throw ApiError(400, fmt::format("the body is not valid JSON: {}", printable(what)),
                   frames_.empty() ? "" : printable(top_key_));
  }

 private:
  struct Frame {
    ojson* value;
    int64_t count = 0;                              // keys or elements so far
    std::unordered_map<std::string, size_t> index;  // key -> position (objects past kLinearKeys keys)
  };
  static constexpr size_t kLinearKeys = 8;

  [[noreturn]] void fail(const std::string& msg) const {
    throw ApiError(400, msg, frames_.empty() ? "" : printable(top_key_));
  }

  // Places v in the open container (or as the root); returns where it is.
  ojson* place(ojson v) {
    if (++values_ > limits_.max_values) {
      fail(fmt::format("the body has more than {} JSON values", limits_.max_values));
    }
    if ((values_ & 4095) == 0 && cancel_ != nullptr && cancel_->load(std::memory_order_relaxed)) {
      throw ApiError(503, "the server is shutting down", "", "server_error");
    }
    if (frames_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Frame& f = frames_.back();
    if (f.value->is_array()) {
      ++f.count;
      auto& a = f.value->get_ref<ojson::array_t&>();
      a.push_back(std::move(v));
      return &a.back();
    }
    // ordered_map is a vector of pairs whose own insertion searches linearly: append to the vector.
    auto& o = static_cast<ojson::object_t::Container&>(f.value->get_ref<ojson::object_t&>());
    // A duplicate key: the last value, in the first one's place.
    if (o.size() < kLinearKeys) {
      for (auto& kv : o) {
        if (kv.first == key_) {
          kv.second = std::move(v);
          return &kv.second;
        }
      }
    } else {
      if (f.index.empty()) {
        for (size_t i = 0; i < o.size(); ++i) f.index.emplace(o[i].first, i);
      }
      auto [it, inserted] = f.index.emplace(key_, o.size());
      if (!inserted) {
        o[it->second].second = std::move(v);
        return &o[it->second].second;
      }
    }
    o.emplace_back(std::move(key_), std::move(v));
    return &o.back().second;
  }
  bool put(ojson v) {
    place(std::move(v));
    return true;
  }
  bool open(ojson container) {
    if (int(frames_.size()) >= limits_.max_depth) {
      fail(fmt::format("the body nests more than {} levels", limits_.max_depth));
    }
    ojson* at = place(std::move(container));
    frames_.push_back(Frame{at});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return true;
  }

  const JsonLimits& limits_;
  const std::atomic<bool>* cancel_;
  ojson root_;
  std::vector<Frame> frames_;
  std::string key_;
  std::string top_key_;  // the top-level object's key being read (names the field of an error)
  int64_t values_ = 0;
};

}  // namespace

ojson parse_json_body(std::string_view body, const JsonLimits& limits, const std::atomic<bool>* cancel) {
  Builder b(limits, cancel);
  ojson::sax_parse(body, &b);
  return b.take();
}

JsonShape json_shape(const ojson& j) {
  JsonShape shape;
  // No recursion: the depth is the client's. The flag: the value is an annotation key's (its string
  // uncounted).
  std::vector<std::pair<const ojson*, bool>> pending = {{&j, false}};
  while (!pending.empty()) {
    const auto [v, annotation] = pending.back();
    pending.pop_back();
    ++shape.values;
    if (v->is_string() && !annotation)
      shape.literal_bytes += int64_t(v->get_ref<const std::string&>().size());
    if (v->is_object()) {
      shape.max_object_keys = std::max(shape.max_object_keys, int64_t(v->size()));
      for (const auto& [key, x] : v->items()) {
        shape.literal_bytes += int64_t(key.size());
        if (key == "pattern" && x.is_string())
          shape.pattern_size =
              std::max(shape.pattern_size, regex_expanded_size(x.get_ref<const std::string&>()));
        if (key == "patternProperties" && x.is_object()) {  // its keys are patterns
          for (const auto& [pattern, unused] : x.items())
            shape.pattern_size = std::max(shape.pattern_size, regex_expanded_size(pattern));
        }
        pending.emplace_back(&x, key == "description" || key == "title" || key == "$comment");
      }
    } else if (v->is_array()) {
      for (const ojson& x : *v) pending.emplace_back(&x, false);
    }
  }
  return shape;
}

int64_t regex_expanded_size(std::string_view re) {
  constexpr int64_t kCap = std::numeric_limits<int64_t>::max() / 2;
  const auto mul = [&](int64_t a, int64_t b) { return b != 0 && a > kCap / b ? kCap : a * b; };
  const auto add = [&](int64_t a, int64_t b) { return a > kCap - b ? kCap : a + b; };
  // One frame a group: the finished alternatives' sum, the current alternative's sum, and the size of the
  // last atom (what a quantifier multiplies). No recursion: the nesting is the client's.
  struct Frame {
    int64_t alternatives = 0, current = 0, last = 0;
  };
  std::vector<Frame> stack(1);
  const auto atom = [&](int64_t size) {
    stack.back().current = add(stack.back().current, size);
    stack.back().last = size;
  };
  // A counted repetition at i ("{n}", "{n,}", "{n,m}"): its largest bound and its length; else 0 (a literal
  // '{').
  const auto counted = [&](size_t i, int64_t* bound) -> size_t {
    size_t j = i + 1;
    int64_t n = 0, m = -1;
    const auto number = [&](int64_t* out) {
      const size_t start = j;
      *out = 0;
      while (j < re.size() && re[j] >= '0' && re[j] <= '9') *out = add(mul(*out, 10), re[j++] - '0');
      return j > start;
    };
    if (!number(&n)) return 0;
    if (j < re.size() && re[j] == ',') {
      ++j;
      int64_t hi = 0;
      m = number(&hi) ? hi : add(n, 1);
    }
    if (j >= re.size() || re[j] != '}') return 0;
    *bound = std::max(n, m);
    return j + 1 - i;
  };
  for (size_t i = 0; i < re.size();) {
    const char c = re[i];
    int64_t bound = 0;
    size_t len = 0;
    if (c == '\\') {
      atom(1);
      i += 2;
    } else if (c == '[') {  // a class: to its closing ']' (one written first or after '^' is a member)
      size_t j = i + 1;
      if (j < re.size() && re[j] == '^') ++j;
      if (j < re.size() && re[j] == ']') ++j;
      while (j < re.size() && re[j] != ']') j += re[j] == '\\' ? 2 : 1;
      atom(1);
      i = j + 1;
    } else if (c == '(') {
      stack.emplace_back();
      ++i;
    } else if (c == ')' && stack.size() > 1) {
      const Frame f = stack.back();
      stack.pop_back();
      atom(add(f.alternatives, f.current));
      ++i;
    } else if (c == '|') {
      stack.back().alternatives = add(stack.back().alternatives, stack.back().current);
      stack.back().current = 0;
      stack.back().last = 0;
      ++i;
    } else if (c == '{' && (len = counted(i, &bound)) > 0) {
      Frame& f = stack.back();  // the last atom now counts bound times (it counted once)
      f.current = add(f.current, mul(f.last, bound > 0 ? bound - 1 : 0));
      f.last = mul(f.last, bound);
      i += len;
    } else if (c == '*' || c == '+' || c == '?' || c == '^' || c == '$') {
      ++i;
    } else {
      atom(1);
      ++i;
    }
  }
  int64_t total = 0;  // unclosed groups (an invalid pattern, refused later) count as closed
  while (!stack.empty()) {
    const Frame f = stack.back();
    stack.pop_back();
    total = add(add(f.alternatives, f.current), total);
  }
  return total;
}

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_length(s, i);
    const uint8_t c = uint8_t(s[i]);
    if (n == 0 || c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02X}", c);
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string dump_json(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace dsaserve::server
