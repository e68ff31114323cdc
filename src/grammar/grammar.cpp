#include "grammar/grammar.h"

#include <dlpack/dlpack.h>
#include <xgrammar/xgrammar.h>

#include <string>

#include "core/error.h"

namespace dsaserve::grammar {

class CompiledGrammar {
 public:
  CompiledGrammar(xgrammar::CompiledGrammar g, bool budgets) : grammar(std::move(g)), has_budgets(budgets) {}
  xgrammar::CompiledGrammar grammar;
  // The tag has a token or character budget (a bounded reasoning block): xgrammar then decides at each
  // mask whether the next accept enforces it, so every accept must follow a mask at its state.
  bool has_budgets;
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

// A budget key of a structural tag (xgrammar's "max_tokens" / "max_chars" of any_text / any_tokens)
// anywhere in it; a JSON schema property of that name counts too (that only costs masks).
bool has_budget_key(const nlohmann::ordered_json& j) {
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) {
      if (k == "max_tokens" || k == "max_chars" || has_budget_key(v)) return true;
    }
  } else if (j.is_array()) {
    for (const auto& v : j) {
      if (has_budget_key(v)) return true;
    }
  }
  return false;
}

// One request's matcher: the bitmask is filled before each sample and applied to the logits. Rollback
// reaches back to the matcher's start (xgrammar 0.2.9 keeps its whole token history; its
// max_rollback_tokens argument is unused).
class XgrammarConstraint final : public runtime::TokenConstraint {
 public:
  XgrammarConstraint(std::shared_ptr<const CompiledGrammar> g, int64_t vocab_size)
      : grammar_(std::move(g)),
        matcher_(grammar_->grammar, std::nullopt, false),
        mask_{std::vector<uint32_t>(size_t(xgrammar::GetBitmaskSize(int(vocab_size))), 0u), vocab_size} {}

  void mask_logits(std::span<float> logits) override {
    fill_mask(mask_);
    mask_.apply(logits);
  }

  void fill_mask(runtime::TokenMask& m) override {
    DSA_CHECK(!matcher_.IsTerminated(), "grammar: the matcher has terminated: no next token");
    m.vocab = mask_.vocab;
    m.words.resize(mask_.words.size());
    DLTensor t{};
    int64_t shape[1] = {int64_t(m.words.size())};
    t.data = m.words.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = 1;
    t.dtype = xgrammar::GetBitmaskDLType();
    t.shape = shape;
    matcher_.FillNextTokenBitmask(&t, 0);
    masked_ = true;
  }

  bool accept(int32_t token) override {
    // The budget's decision for this position is taken by a mask: take it when no mask was asked for
    // since the last accept (a speculative round's tokens, accepted again after its rollback).
    if (grammar_->has_budgets && !masked_ && !matcher_.IsTerminated()) fill_mask(mask_);
    const bool ok = matcher_.AcceptToken(token);
    if (ok) {
      ++accepted_;
      masked_ = false;
    }
    return ok;
  }

  void rollback(int64_t n) override {
    DSA_CHECK(n >= 0 && n <= accepted_, "grammar: rolling back {} of {} accepted tokens", n, accepted_);
    if (n == 0) return;
    matcher_.Rollback(int(n));
    accepted_ -= n;
    masked_ = false;
  }

  bool terminated() const override { return matcher_.IsTerminated(); }

 private:
  std::shared_ptr<const CompiledGrammar> grammar_;
  xgrammar::GrammarMatcher matcher_;
  runtime::TokenMask mask_;  // mask_logits' (and accept's) own
  int64_t accepted_ = 0;     // tokens accepted and not rolled back
  bool masked_ = false;      // a mask was filled at the current state
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
    g = std::make_shared<CompiledGrammar>(impl_->compiler.CompileStructuralTag(structural_tag.dump()),
                                          has_budget_key(structural_tag));
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
