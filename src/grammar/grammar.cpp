#include "grammar/grammar.h"

#include <dlpack/dlpack.h>
#include <xgrammar/xgrammar.h>

#include <limits>
#include <string>

#include "core/error.h"

namespace dsaserve::grammar {

class CompiledGrammar {
 public:
  explicit CompiledGrammar(xgrammar::CompiledGrammar g) : grammar(std::move(g)) {}
  xgrammar::CompiledGrammar grammar;
};

namespace {

// The decoded bytes of every id below `vocab_size`: empty (never allowed by xgrammar) for special tokens
// and ids the tokenizer does not know.
std::vector<std::string> decoded_vocab(const tokenizer::Tokenizer& tok, int64_t vocab_size) {
  std::vector<std::string> out(size_t(std::min<int64_t>(vocab_size, int64_t(tok.vocab_size()))));
  const bool bytewise = tok.bytewise_decoding();
  for (size_t i = 0; i < out.size(); ++i) {
    const uint32_t id = uint32_t(i);
    if (tok.is_special(id)) continue;
    if (bytewise) {
      out[i] = std::string(tok.token_bytes(id, /*skip_special_tokens=*/true));
    } else {
      out[i] = tok.decode(std::span<const uint32_t>(&id, 1), /*skip_special_tokens=*/true);
    }
  }
  return out;
}

// xgrammar's messages start with "[time] file.cc:line: ": the reader needs only what follows.
std::string without_log_prefix(std::string_view m) {
  const size_t cc = m.find(".cc:");
  if (m.empty() || m[0] != '[' || cc == std::string_view::npos) return std::string(m);
  const size_t colon = m.find(": ", cc);
  std::string out(colon == std::string_view::npos ? m : m.substr(colon + 2));
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// One request's matcher: the bitmask is filled before each sample and applied to the logits.
class XgrammarConstraint final : public runtime::TokenConstraint {
 public:
  XgrammarConstraint(std::shared_ptr<const CompiledGrammar> g, int64_t vocab_size)
      : grammar_(std::move(g)),
        matcher_(grammar_->grammar, std::nullopt, false),
        vocab_size_(vocab_size),
        bitmask_(size_t(xgrammar::GetBitmaskSize(int(vocab_size))), 0) {}

  void mask_logits(std::span<float> logits) override {
    DLTensor t{};
    int64_t shape[1] = {int64_t(bitmask_.size())};
    t.data = bitmask_.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = 1;
    t.dtype = xgrammar::GetBitmaskDLType();
    t.shape = shape;
    matcher_.FillNextTokenBitmask(&t, 0);
    const size_t n = std::min(logits.size(), size_t(vocab_size_));
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    for (size_t w = 0; w * 32 < n; ++w) {
      const uint32_t bits = uint32_t(bitmask_[w]);
      if (bits == 0xFFFFFFFFu) continue;
      const size_t end = std::min(n, w * 32 + 32);
      for (size_t i = w * 32; i < end; ++i) {
        if (((bits >> (i - w * 32)) & 1u) == 0) logits[i] = kNegInf;
      }
    }
    for (size_t i = n; i < logits.size(); ++i) logits[i] = kNegInf;
  }

  bool accept(int32_t token) override { return matcher_.AcceptToken(token); }
  bool terminated() const override { return matcher_.IsTerminated(); }

 private:
  std::shared_ptr<const CompiledGrammar> grammar_;
  xgrammar::GrammarMatcher matcher_;
  int64_t vocab_size_;
  std::vector<int32_t> bitmask_;
};

}  // namespace

struct GrammarBackend::Impl {
  Impl(xgrammar::TokenizerInfo info, int threads)
      : tokenizer_info(std::move(info)),
        compiler(tokenizer_info, threads, /*cache_enabled=*/true, /*max_memory_bytes=*/int64_t(256) << 20) {}
  xgrammar::TokenizerInfo tokenizer_info;
  xgrammar::GrammarCompiler compiler;
};

GrammarBackend::GrammarBackend(const tokenizer::Tokenizer& tok, int64_t vocab_size,
                               std::vector<int32_t> stop_token_ids, int threads)
    : vocab_size_(vocab_size) {
  DSA_CHECK(vocab_size > 0, "grammar: vocab size must be positive, got {}", vocab_size);
  std::vector<int32_t> stops;
  for (int32_t id : stop_token_ids) {
    if (id >= 0 && id < vocab_size) stops.push_back(id);
  }
  DSA_CHECK(!stops.empty(), "grammar: the model has no stop (EOS) token id below its vocab size {}",
            vocab_size);
  try {
    impl_ = std::make_unique<Impl>(
        xgrammar::TokenizerInfo(decoded_vocab(tok, vocab_size), xgrammar::VocabType::RAW, int(vocab_size),
                                stops, false),
        std::max(1, threads));
  } catch (const std::exception& e) {
    fail("grammar: cannot build the token table: {}", e.what());
  }
}

GrammarBackend::~GrammarBackend() = default;

std::shared_ptr<const CompiledGrammar> GrammarBackend::compile(const nlohmann::ordered_json& structural_tag) {
  std::shared_ptr<const CompiledGrammar> g;
  try {
    g = std::make_shared<CompiledGrammar>(impl_->compiler.CompileStructuralTag(structural_tag.dump()));
  } catch (const std::exception& e) {
    fail("{}", without_log_prefix(e.what()));
  }
  return g;
}

std::shared_ptr<runtime::TokenConstraint> GrammarBackend::make_constraint(
    const std::shared_ptr<const CompiledGrammar>& g) const {
  DSA_CHECK(g != nullptr, "grammar: no compiled grammar");
  return std::make_shared<XgrammarConstraint>(g, vocab_size_);
}

}  // namespace dsaserve::grammar
