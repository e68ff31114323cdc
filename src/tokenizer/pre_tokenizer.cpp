#include "tokenizer/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/utf8.h"

namespace dsaserve::tokenizer {
namespace {

// Rust's is_ascii_punctuation || Unicode punctuation (P*).
constexpr const char* kPunctuationClass = "[\\p{P}!-/:-@\\[-`{-~]";
// GPT-2's pre-tokenizer pattern (ByteLevel use_regex).
constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

std::string white_space_char() { return "[" + std::string(kWhiteSpaceClassBody) + "]"; }

SplitBehavior parse_behavior(const nlohmann::json& spec, const std::string& where, SplitBehavior fallback) {
  auto it = spec.find("behavior");
  if (it == spec.end() || it->is_null()) return fallback;
  if (!it->is_string()) fail("{}.behavior: expected a string", where);
  const std::string& b = it->get_ref<const std::string&>();
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  fail("{}.behavior: unknown split behavior \"{}\"", where, b);
}

// Copies text[begin, end) to the end of w.buf (safe although the source lies in w.buf).
uint32_t append_copy(std::string& buf, uint32_t begin, uint32_t end, std::string_view prefix = {}) {
  const auto off = static_cast<uint32_t>(buf.size());
  buf.reserve(buf.size() + prefix.size() + (end - begin));
  buf.append(prefix);
  buf.append(buf.data() + begin, end - begin);
  return off;
}

// Splits every piece of w.in on a regex with one of HF's behaviors, as NormalizedString::split.
class SplitStep final : public PreTokenizerStep {
 public:
  SplitStep(const std::string& regex, SplitBehavior behavior, bool invert, const std::string& where)
      : re_(regex, where + ".pattern"), behavior_(behavior), invert_(invert) {}

  void apply(PipelineWork& w) const override {
    for (const Piece& p : w.in) split(w, p);
  }

  void split(PipelineWork& w, const Piece& p) const {
    const char* text = w.buf.data() + p.begin;
    const size_t n = p.end - p.begin;
    auto emit = [&](size_t b, size_t e) {
      if (b < e)
        w.out.push_back({p.begin + static_cast<uint32_t>(b), p.begin + static_cast<uint32_t>(e),
                         b == 0 && p.at_text_start});
    };
    if (behavior_ == SplitBehavior::kIsolated) {  // every range is kept: no need to list them
      size_t prev = 0;
      re_.for_each_match(text, n, [&](size_t b, size_t e) {
        emit(prev, b);
        emit(b, e);
        prev = e;
      });
      emit(prev, n);
      return;
    }
    auto& splits = w.splits;
    splits.clear();
    auto range = [&](size_t b, size_t e) {
      return Piece{static_cast<uint32_t>(b), static_cast<uint32_t>(e), false};
    };
    size_t prev = 0;
    re_.for_each_match(text, n, [&](size_t b, size_t e) {
      if (prev != b) splits.push_back({range(prev, b), invert_});
      splits.push_back({range(b, e), !invert_});
      prev = e;
    });
    if (prev != n) splits.push_back({range(prev, n), invert_});

    auto& merged = w.merged;  // (range, removed)
    merged.clear();
    bool previous_match = false;
    switch (behavior_) {
      case SplitBehavior::kRemoved:
        for (auto& [r, m] : splits) merged.push_back({r, m});
        break;
      case SplitBehavior::kContiguous:
        for (auto& [r, m] : splits) {
          if (m == previous_match && !merged.empty())
            merged.back().first.end = r.end;
          else
            merged.push_back({r, false});
          previous_match = m;
        }
        break;
      case SplitBehavior::kMergedWithPrevious:
        for (auto& [r, m] : splits) {
          if (m && !previous_match && !merged.empty())
            merged.back().first.end = r.end;
          else
            merged.push_back({r, false});
          previous_match = m;
        }
        break;
      case SplitBehavior::kMergedWithNext:
        for (size_t k = splits.size(); k-- > 0;) {
          auto& [r, m] = splits[k];
          if (m && !previous_match && !merged.empty())
            merged.back().first.begin = r.begin;
          else
            merged.push_back({r, false});
          previous_match = m;
        }
        std::reverse(merged.begin(), merged.end());
        break;
      case SplitBehavior::kIsolated: break;
    }
    for (auto& [r, removed] : merged) {
      if (!removed) emit(r.begin, r.end);
    }
  }

 private:
  Regex re_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelStep final : public PreTokenizerStep {
 public:
  ByteLevelStep(bool add_prefix_space, bool use_regex, const std::string& where)
      : add_prefix_space_(add_prefix_space),
        split_(use_regex ? std::make_unique<SplitStep>(kGpt2Pattern, SplitBehavior::kIsolated, false, where)
                         : nullptr) {}
  // Spell the pieces in the byte-level alphabet here (a later step reads them) instead of in the model.
  void set_materialize(bool m) { materialize_ = m; }

  void apply(PipelineWork& w) const override {
    if (add_prefix_space_) {
      for (Piece& p : w.in) {
        if (w.buf[p.begin] == ' ') continue;
        const uint32_t len = p.end - p.begin;
        p.begin = append_copy(w.buf, p.begin, p.end, " ");
        p.end = p.begin + len + 1;
      }
    }
    if (split_) {
      split_->apply(w);
    } else {
      w.out.insert(w.out.end(), w.in.begin(), w.in.end());
    }
    if (materialize_) {
      std::string spelled;
      for (Piece& p : w.out) {
        spelled.clear();
        append_byte_level(std::string_view(w.buf).substr(p.begin, p.end - p.begin), spelled);
        p.begin = static_cast<uint32_t>(w.buf.size());
        w.buf += spelled;
        p.end = static_cast<uint32_t>(w.buf.size());
      }
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<SplitStep> split_;
  bool materialize_ = false;
};

class MetaspaceStep final : public PreTokenizerStep {
 public:
  enum class Prepend { kAlways, kNever, kFirst };
  MetaspaceStep(std::string replacement, Prepend prepend, bool split, const std::string& where)
      : replacement_(std::move(replacement)),
        prepend_(prepend),
        split_(split ? std::make_unique<SplitStep>(regex_escape(replacement_), SplitBehavior::kMergedWithNext,
                                                   false, where)
                     : nullptr) {}

  void apply(PipelineWork& w) const override {
    std::string text;
    for (Piece& p : w.in) {
      text.clear();
      for (uint32_t i = p.begin; i < p.end; ++i) {
        if (w.buf[i] == ' ')
          text += replacement_;
        else
          text += w.buf[i];
      }
      const bool starts = text.rfind(replacement_, 0) == 0;
      if (!starts && (prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && p.at_text_start))) {
        text.insert(0, replacement_);
      }
      p.begin = static_cast<uint32_t>(w.buf.size());
      w.buf += text;
      p.end = static_cast<uint32_t>(w.buf.size());
    }
    if (split_)
      split_->apply(w);
    else
      w.out.insert(w.out.end(), w.in.begin(), w.in.end());
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  std::unique_ptr<SplitStep> split_;
};

void add_pre_tokenizer(const nlohmann::json& spec, const std::string& where,
                       std::vector<std::unique_ptr<PreTokenizerStep>>& steps) {
  const std::string type = string_field(spec, "type", where);
  if (type == "Sequence") {
    const auto& list = array_field(spec, "pretokenizers", where);
    for (size_t i = 0; i < list.size(); ++i) {
      add_pre_tokenizer(list[i], fmt::format("{}.pretokenizers[{}]", where, i), steps);
    }
  } else if (type == "Split") {
    steps.push_back(std::make_unique<SplitStep>(pattern_regex(spec, where),
                                                parse_behavior(spec, where, SplitBehavior::kIsolated),
                                                bool_field(spec, "invert", where, false), where));
  } else if (type == "ByteLevel") {
    steps.push_back(std::make_unique<ByteLevelStep>(bool_field(spec, "add_prefix_space", where, true),
                                                    bool_field(spec, "use_regex", where, true), where));
  } else if (type == "Digits") {
    const bool individual = bool_field(spec, "individual_digits", where, false);
    steps.push_back(std::make_unique<SplitStep>(
        "\\p{N}", individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, false, where));
  } else if (type == "Punctuation") {
    steps.push_back(std::make_unique<SplitStep>(
        kPunctuationClass, parse_behavior(spec, where, SplitBehavior::kIsolated), false, where));
  } else if (type == "Whitespace") {
    steps.push_back(std::make_unique<SplitStep>("\\w+|[^\\w\\s]+", SplitBehavior::kRemoved, true, where));
  } else if (type == "WhitespaceSplit") {
    steps.push_back(std::make_unique<SplitStep>(white_space_char(), SplitBehavior::kRemoved, false, where));
  } else if (type == "BertPreTokenizer") {
    steps.push_back(std::make_unique<SplitStep>(white_space_char(), SplitBehavior::kRemoved, false, where));
    steps.push_back(std::make_unique<SplitStep>(kPunctuationClass, SplitBehavior::kIsolated, false, where));
  } else if (type == "CharDelimiterSplit") {
    const std::string d = string_field(spec, "delimiter", where);
    steps.push_back(std::make_unique<SplitStep>(regex_escape(d), SplitBehavior::kRemoved, false, where));
  } else if (type == "Metaspace") {
    const std::string replacement = string_field(spec, "replacement", where);
    auto scheme = MetaspaceStep::Prepend::kAlways;
    auto it = spec.find("prepend_scheme");
    if (it != spec.end() && !it->is_null()) {
      const std::string s = string_field(spec, "prepend_scheme", where);
      if (s == "always")
        scheme = MetaspaceStep::Prepend::kAlways;
      else if (s == "never")
        scheme = MetaspaceStep::Prepend::kNever;
      else if (s == "first")
        scheme = MetaspaceStep::Prepend::kFirst;
      else
        fail("{}.prepend_scheme: unknown value \"{}\"", where, s);
    } else if (!bool_field(spec, "add_prefix_space", where, true)) {
      scheme = MetaspaceStep::Prepend::kNever;
    }
    steps.push_back(
        std::make_unique<MetaspaceStep>(replacement, scheme, bool_field(spec, "split", where, true), where));
  } else {
    fail("{}.type: pre-tokenizer \"{}\" is not supported", where, type);
  }
}

// Replaces every match of a regex with fixed content (the Replace normalizer).
class ReplaceStep final : public NormalizerStep {
 public:
  ReplaceStep(const std::string& regex, std::string content, const std::string& where)
      : re_(regex, where + ".pattern"), content_(std::move(content)) {}
  void apply(std::string& text) const override {
    std::string out;
    size_t prev = 0;
    re_.for_each_match(text.data(), text.size(), [&](size_t b, size_t e) {
      out.append(text, prev, b - prev);
      out += content_;
      prev = e;
    });
    out.append(text, prev, std::string::npos);
    text.swap(out);
  }

 private:
  Regex re_;
  std::string content_;
};

class PrependStep final : public NormalizerStep {
 public:
  explicit PrependStep(std::string prefix) : prefix_(std::move(prefix)) {}
  void apply(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

bool is_white_space(uint32_t cp) {
  return (cp >= 0x9 && cp <= 0xD) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

class StripStep final : public NormalizerStep {
 public:
  StripStep(bool left, bool right) : left_(left), right_(right) {}
  void apply(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t i = begin;
        if (!is_white_space(next_code_point(text, i))) break;
        begin = i;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t i = start;
        if (!is_white_space(next_code_point(text, i))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class ByteLevelNormalizerStep final : public NormalizerStep {
 public:
  void apply(std::string& text) const override {
    std::string out;
    append_byte_level(text, out);
    text.swap(out);
  }
};

void add_normalizer(const nlohmann::json& spec, const std::string& where,
                    std::vector<std::unique_ptr<NormalizerStep>>& steps) {
  const std::string type = string_field(spec, "type", where);
  if (type == "Sequence") {
    const auto& list = array_field(spec, "normalizers", where);
    for (size_t i = 0; i < list.size(); ++i)
      add_normalizer(list[i], fmt::format("{}.normalizers[{}]", where, i), steps);
  } else if (type == "Prepend") {
    steps.push_back(std::make_unique<PrependStep>(string_field(spec, "prepend", where)));
  } else if (type == "Replace") {
    steps.push_back(std::make_unique<ReplaceStep>(pattern_regex(spec, where),
                                                  string_field(spec, "content", where), where));
  } else if (type == "Strip") {
    steps.push_back(std::make_unique<StripStep>(bool_field(spec, "strip_left", where, true),
                                                bool_field(spec, "strip_right", where, true)));
  } else if (type == "ByteLevel") {
    steps.push_back(std::make_unique<ByteLevelNormalizerStep>());
  } else {
    fail("{}.type: normalizer \"{}\" is not supported", where, type);
  }
}

}  // namespace

void Normalizer::load(const nlohmann::json& spec, const std::string& where) {
  steps_.clear();
  if (!spec.is_null()) add_normalizer(spec, where, steps_);
}

void Normalizer::apply(std::string& text) const {
  for (const auto& s : steps_) s->apply(text);
}

void PreTokenizer::load(const nlohmann::json& spec, const std::string& where) {
  steps_.clear();
  raw_bytes_ = false;
  if (spec.is_null()) return;
  add_pre_tokenizer(spec, where, steps_);
  // A ByteLevel step spells its pieces unless it is the last step: then the model spells them.
  for (size_t i = 0; i < steps_.size(); ++i) {
    if (auto* bl = dynamic_cast<ByteLevelStep*>(steps_[i].get())) {
      const bool last = i + 1 == steps_.size();
      bl->set_materialize(!last);
      raw_bytes_ = last;
    }
  }
}

void PreTokenizer::apply(PipelineWork& w) const {
  for (const auto& s : steps_) {
    w.out.clear();
    s->apply(w);
    w.in.swap(w.out);
  }
}

}  // namespace dsaserve::tokenizer
