#pragma once
// GrammarBackend: grammar-constrained decoding over xgrammar's C++ core. It holds the model's vocabulary
// as xgrammar sees it (each token's decoded bytes; special tokens other than the stop tokens are never
// allowed, so the constrained text is exactly what the detokenizer yields) and a compiler whose cache
// keeps compiled grammars by their structural-tag text. compile() runs on the caller's thread (the HTTP
// handler, not the engine); make_constraint() gives a request its own matcher (a
// runtime::TokenConstraint the engine thread masks, advances and, in speculative rounds, rolls back).
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "runtime/sampler/constraint.h"
#include "tokenizer/tokenizer.h"

namespace dsaserve::grammar {

// A compiled grammar (immutable, shared by the requests that use it).
class CompiledGrammar;

class GrammarBackend {
 public:
  // `vocab_size`: the model's (logit rows may be wider than the tokenizer's vocabulary: the extra ids are
  // never allowed). `stop_token_ids`: the ids that end a request (the only ones allowed once a grammar is
  // complete). `threads`: compiler threads.
  GrammarBackend(const tokenizer::Tokenizer& tok, int64_t vocab_size, std::vector<int32_t> stop_token_ids,
                 int threads = 1);
  ~GrammarBackend();
  GrammarBackend(const GrammarBackend&) = delete;
  GrammarBackend& operator=(const GrammarBackend&) = delete;

  // Compiles a structural tag (see structural_tag.h); cached by its text. Thread-safe. Throws
  // dsaserve::Error with xgrammar's message when the tag (a JSON schema in it) is invalid.
  std::shared_ptr<const CompiledGrammar> compile(const nlohmann::ordered_json& structural_tag);
  // A fresh matcher at the grammar's start, for one request.
  std::shared_ptr<runtime::TokenConstraint> make_constraint(
      const std::shared_ptr<const CompiledGrammar>& g) const;

  int64_t vocab_size() const { return vocab_size_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t vocab_size_ = 0;
};

}  // namespace dsaserve::grammar
