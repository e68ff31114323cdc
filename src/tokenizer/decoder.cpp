#include "tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace dsaserve::tokenizer {
namespace {

// Tokens spelled in the byte-level alphabet become their bytes (a token with another character stays
// as it is); everything is joined and decoded as UTF-8 with replacement.
class ByteLevelDecoder final : public DecoderStep {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string bytes, one;
    for (const std::string& t : tokens) {
      one.clear();
      if (byte_level_to_bytes(t, one))
        bytes += one;
      else
        bytes += t;
    }
    std::string text;
    append_utf8_lossy(bytes.data(), bytes.size(), text, true);
    tokens.assign(1, std::move(text));
  }
};

// Runs of "<0xAB>" tokens become the text of their bytes, or one U+FFFD per byte when not valid UTF-8.
class ByteFallbackDecoder final : public DecoderStep {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    auto flush = [&] {
      if (bytes.empty()) return;
      if (utf8_valid_prefix(bytes) == bytes.size()) {
        out.push_back(bytes);
      } else {
        for (size_t i = 0; i < bytes.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      bytes.clear();
    };
    for (std::string& t : tokens) {
      int value = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') value = parse_hex(t[3], t[4]);
      if (value >= 0) {
        bytes.push_back(static_cast<char>(value));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int parse_hex(char a, char b) { return hex(a) < 0 || hex(b) < 0 ? -1 : hex(a) * 16 + hex(b); }
};

class FuseDecoder final : public DecoderStep {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDecoder final : public DecoderStep {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t k = 0; k < start_ && t.compare(b, content_.size(), content_) == 0 && b < e; ++k)
        b += content_.size();
      for (size_t k = 0; k < stop_ && e >= b + content_.size() &&
                         t.compare(e - content_.size(), content_.size(), content_) == 0;
           ++k) {
        e -= content_.size();
      }
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class ReplaceDecoder final : public DecoderStep {
 public:
  ReplaceDecoder(const std::string& regex, std::string content, const std::string& where)
      : re_(regex, where + ".pattern"), content_(std::move(content)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::string out;
      size_t prev = 0;
      re_.for_each_match(t.data(), t.size(), [&](size_t b, size_t e) {
        out.append(t, prev, b - prev);
        out += content_;
        prev = e;
      });
      out.append(t, prev, std::string::npos);
      t.swap(out);
    }
  }

 private:
  Regex re_;
  std::string content_;
};

// The replacement character becomes a space, except in the first token where it is dropped (unless
// the prepend scheme is "never").
class MetaspaceDecoder final : public DecoderStep {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t p = 0; p < t.size();) {
        if (!replacement_.empty() && t.compare(p, replacement_.size(), replacement_) == 0) {
          if (!(i == 0 && strip_first_)) out += ' ';
          p += replacement_.size();
        } else {
          out += t[p++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

// The end-of-word suffix becomes a space, or nothing on the last token.
class BpeSuffixDecoder final : public DecoderStep {
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string with = i + 1 == tokens.size() ? "" : " ";
      std::string out;
      const std::string& t = tokens[i];
      for (size_t p = 0; p < t.size();) {
        if (!suffix_.empty() && t.compare(p, suffix_.size(), suffix_) == 0) {
          out += with;
          p += suffix_.size();
        } else {
          out += t[p++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string suffix_;
};

size_t count_field(const nlohmann::json& spec, const char* key, const std::string& where) {
  auto it = spec.find(key);
  if (it == spec.end() || it->is_null()) return 0;
  if (!it->is_number_unsigned()) fail("{}.{}: expected a non-negative integer", where, key);
  return it->get<size_t>();
}

void add_decoder(const nlohmann::json& spec, const std::string& where,
                 std::vector<std::unique_ptr<DecoderStep>>& steps) {
  const std::string type = string_field(spec, "type", where);
  if (type == "Sequence") {
    const auto& list = array_field(spec, "decoders", where);
    for (size_t i = 0; i < list.size(); ++i)
      add_decoder(list[i], fmt::format("{}.decoders[{}]", where, i), steps);
  } else if (type == "ByteLevel") {
    steps.push_back(std::make_unique<ByteLevelDecoder>());
  } else if (type == "ByteFallback") {
    steps.push_back(std::make_unique<ByteFallbackDecoder>());
  } else if (type == "Fuse") {
    steps.push_back(std::make_unique<FuseDecoder>());
  } else if (type == "Strip") {
    steps.push_back(std::make_unique<StripDecoder>(string_field(spec, "content", where),
                                                   count_field(spec, "start", where),
                                                   count_field(spec, "stop", where)));
  } else if (type == "Replace") {
    steps.push_back(std::make_unique<ReplaceDecoder>(pattern_regex(spec, where),
                                                     string_field(spec, "content", where), where));
  } else if (type == "Metaspace") {
    bool strip_first = bool_field(spec, "add_prefix_space", where, true);
    auto it = spec.find("prepend_scheme");
    if (it != spec.end() && it->is_string()) strip_first = it->get<std::string>() != "never";
    steps.push_back(
        std::make_unique<MetaspaceDecoder>(string_field(spec, "replacement", where), strip_first));
  } else if (type == "BPEDecoder") {
    auto it = spec.find("suffix");
    steps.push_back(std::make_unique<BpeSuffixDecoder>(
        it != spec.end() && it->is_string() ? it->get<std::string>() : "</w>"));
  } else {
    fail("{}.type: decoder \"{}\" is not supported", where, type);
  }
}

}  // namespace

void Decoder::load(const nlohmann::json& spec, const std::string& where) {
  steps_.clear();
  present_ = !spec.is_null();
  if (present_) add_decoder(spec, where, steps_);
  byte_level_only_ = steps_.size() == 1 && dynamic_cast<const ByteLevelDecoder*>(steps_[0].get()) != nullptr;
}

std::string Decoder::decode(std::vector<std::string> tokens) const {
  std::string out;
  if (!present_) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  for (const auto& s : steps_) s->apply(tokens);
  for (const auto& t : tokens) out += t;
  return out;
}

}  // namespace dsaserve::tokenizer
