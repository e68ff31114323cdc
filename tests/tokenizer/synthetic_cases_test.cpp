// Small tokenizer.json files made by make_synthetic.py with HF tokenizers, covering what the DeepSeek
// file does not: merges as pairs, ignore_merges, lstrip / rstrip / single_word / normalized added
// tokens, normalizers, every Split behavior, Digits, Punctuation, Metaspace, byte fallback, unknown
// tokens and other decoders. Each case must match HF's ids and decodes exactly.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/fixtures.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace dsaserve::tokenizer {
namespace {

using nlohmann::json;

std::filesystem::path data_dir() { return dsaserve::testing::repo_dir() / "tests" / "tokenizer" / "data"; }

TEST(SyntheticCases, MatchHuggingFace) {
  std::ifstream in(data_dir() / "synthetic_cases.jsonl");
  ASSERT_TRUE(in) << "missing " << data_dir() / "synthetic_cases.jsonl";
  std::map<std::string, Tokenizer> tokenizers;
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    const json c = json::parse(line);
    const std::string name = c["tokenizer"];
    if (!tokenizers.count(name))
      tokenizers.emplace(name, Tokenizer::from_file(data_dir() / (name + ".json")));
    const Tokenizer& tok = tokenizers.at(name);
    const std::string text = c["text"];
    const auto expected = c["ids"].get<std::vector<uint32_t>>();
    EXPECT_EQ(tok.encode(text, c["parse_special"].get<bool>()), expected) << name << ": " << text;
    EXPECT_EQ(tok.decode(expected, false), c["decoded"].get<std::string>()) << name << ": " << text;
    EXPECT_EQ(tok.decode(expected, true), c["decoded_skip_special"].get<std::string>())
        << name << ": " << text;
    ++n;
  }
  EXPECT_EQ(n, 348u);
  EXPECT_EQ(tokenizers.size(), 6u);
}

TEST(SyntheticCases, StreamingMatchesDecodeForByteLevel) {
  const Tokenizer tok = Tokenizer::from_file(data_dir() / "byte_level_pairs.json");
  ASSERT_TRUE(tok.bytewise_decoding());
  const auto ids = tok.encode("naïve café 你好 🙂 <special>");
  DecodeStream stream(tok);
  std::string out;
  for (uint32_t id : ids) stream.step(id, out);
  stream.finish(out);
  EXPECT_EQ(out, tok.decode(ids));
}

TEST(SyntheticCases, StreamingWithContextDependentDecoder) {
  // Metaspace-style decoders strip the first token's leading space: the stream must follow decode().
  const Tokenizer tok = Tokenizer::from_file(data_dir() / "metaspace_fallback.json");
  ASSERT_FALSE(tok.bytewise_decoding());
  for (const std::string text : {"The quick brown fox", "naïve café 1,234.56", "你好，世界！"}) {
    const auto ids = tok.encode(text);
    DecodeStream stream(tok);
    std::string out;
    for (uint32_t id : ids) stream.step(id, out);
    stream.finish(out);
    EXPECT_EQ(out, tok.decode(ids)) << text;
  }
}

}  // namespace
}  // namespace dsaserve::tokenizer
