// The BPE merge loops: the quadratic scan (short words) and the heap (long words) must agree.
#include "tokenizer/bpe.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "common/fixtures.h"
#include "tokenizer/utf8.h"

namespace dsaserve::tokenizer {
namespace {

TEST(Bpe, ScanAndHeapMergesAgree) {
  DSA_FIXTURE_PATH(file, "tokenizers/deepseek_v3/tokenizer.json");
  std::ifstream in(file);
  const auto j = nlohmann::json::parse(in);
  BpeModel model;
  model.load(j["model"]);
  EXPECT_EQ(model.merge_count(), 127741u);
  BpeScratch scratch;
  std::mt19937 rng(7);
  const std::string alphabet = "etaoin shrdlu,.0123456789\xE4\xBD\xA0\xE5\xA5\xBD";
  for (int trial = 0; trial < 400; ++trial) {
    std::string word;
    const int n = 1 + static_cast<int>(rng() % 120);
    for (int i = 0; i < n; ++i) word += alphabet[rng() % alphabet.size()];
    std::vector<uint32_t> a, b;
    for (unsigned char c : word) a.push_back(*model.token_to_id(byte_to_utf8()[c]));
    b = a;
    model.merge_small(a, scratch);
    model.merge_large(b, scratch);
    ASSERT_EQ(a, b) << "word of " << n << " bytes";
    // The merged tokens spell the word.
    std::string spelled, raw;
    for (uint32_t id : a) spelled += *model.id_to_token(id);
    ASSERT_TRUE(byte_level_to_bytes(spelled, raw));
    EXPECT_EQ(raw, word);
  }
}

}  // namespace
}  // namespace dsaserve::tokenizer
