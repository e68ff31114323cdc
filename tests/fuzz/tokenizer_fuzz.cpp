// libFuzzer target over the tokenizer: arbitrary bytes encoded (valid UTF-8 must encode, anything else
// must be rejected with dsaserve::Error) and arbitrary ids decoded (always valid UTF-8; the streaming
// detokenizer's pieces join to decode()), on the built-in byte tokenizer and, when the fixtures are
// there, the DeepSeek-V3 tokenizer.json. The first input byte picks the tokenizer and the mode.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz/fuzz_util.h"
#include "server/builtin.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace {

using dsaserve::tokenizer::DecodeStream;
using dsaserve::tokenizer::Tokenizer;

const std::vector<std::unique_ptr<Tokenizer>>& tokenizers() {
  static const auto all = [] {
    std::vector<std::unique_ptr<Tokenizer>> v;
    v.push_back(std::make_unique<Tokenizer>(dsaserve::server::make_builtin_tokenizer()));
    const auto ds = dsaserve::fuzz::fixtures_dir() / "tokenizers" / "deepseek_v3" / "tokenizer.json";
    if (std::filesystem::exists(ds)) {
      v.push_back(std::make_unique<Tokenizer>(Tokenizer::from_file(ds)));
    } else {
      std::fprintf(stderr, "tokenizer_fuzz: %s missing, fuzzing the built-in tokenizer only\n", ds.c_str());
    }
    return v;
  }();
  return all;
}

void check_decode(const Tokenizer& tok, const std::vector<uint32_t>& ids, bool skip) {
  const std::string text = tok.decode(ids, skip);
  DSA_FUZZ_CHECK(dsaserve::fuzz::valid_utf8(text));
  DecodeStream stream(tok, skip);
  std::string joined;
  for (uint32_t id : ids) stream.step(id, joined);
  stream.finish(joined);
  DSA_FUZZ_CHECK(joined == text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto& toks = tokenizers();
  const Tokenizer& tok = *toks[size_t(data[0] >> 1) % toks.size()];
  const bool encode = (data[0] & 1) == 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (encode) {
    const bool parse_special = rest.size() % 2 == 0;
    std::vector<uint32_t> ids;
    try {
      ids = tok.encode(rest, parse_special);
    } catch (const dsaserve::Error&) {
      DSA_FUZZ_CHECK(!dsaserve::fuzz::valid_utf8(rest));  // only invalid UTF-8 may be refused
      return 0;
    }
    DSA_FUZZ_CHECK(dsaserve::fuzz::valid_utf8(rest));
    // Every id is one the tokenizer knows. (Not `< vocab_size()`: the built-in tokenizer's added tokens
    // are renumbered after its 504 model ids, as HF does, onto ids its merges use; vocab_size() is 504.)
    for (uint32_t id : ids) DSA_FUZZ_CHECK(tok.id_to_token(id).has_value());
    check_decode(tok, ids, false);
  } else {
    // Ids from pairs of bytes: in the vocabulary and a little past it (unknown ids are skipped).
    std::vector<uint32_t> ids;
    const uint32_t span = uint32_t(tok.vocab_size()) + 16;
    for (size_t i = 0; i + 1 < rest.size(); i += 2) {
      const uint32_t v = uint32_t(uint8_t(rest[i])) | uint32_t(uint8_t(rest[i + 1])) << 8;
      ids.push_back(tok.vocab_size() > 65000 ? (v * 3u) % span : v % span);
    }
    check_decode(tok, ids, false);
    check_decode(tok, ids, true);
  }
  return 0;
}
