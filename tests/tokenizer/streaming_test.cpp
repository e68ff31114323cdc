// The incremental detokenizer: fed one id at a time, it emits only complete UTF-8, and everything it
// emits (plus the final flush) equals the full decode, also when ids split multi-byte characters or
// form invalid UTF-8.
#include <gtest/gtest.h>

#include <random>

#include "common/fixtures.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace dsaserve::tokenizer {
namespace {

std::string stream_all(const Tokenizer& tok, const std::vector<uint32_t>& ids, bool skip,
                       std::vector<std::string>* chunks = nullptr) {
  DecodeStream stream(tok, skip);
  std::string out;
  for (uint32_t id : ids) {
    std::string chunk = stream.step(id);
    EXPECT_EQ(utf8_valid_prefix(chunk), chunk.size()) << "chunk is not valid UTF-8";
    out += chunk;
    if (chunks) chunks->push_back(chunk);
  }
  out += stream.finish();
  return out;
}

TEST(Streaming, SplitCharactersAreHeldBack) {
  DSA_FIXTURE_PATH(dir, "tokenizers/deepseek_v3");
  const Tokenizer tok = Tokenizer::from_file(dir);
  // Byte tokens of "é" (C3 A9) and "🙂" (F0 9F 99 82): each single byte is a token of its own.
  auto byte_id = [&](unsigned char b) { return *tok.token_to_id(byte_to_utf8()[b]); };
  std::vector<uint32_t> ids = {byte_id('a'),  byte_id(0xC3), byte_id(0xA9), byte_id(0xF0),
                               byte_id(0x9F), byte_id(0x99), byte_id(0x82), byte_id('z')};
  std::vector<std::string> chunks;
  EXPECT_EQ(stream_all(tok, ids, false, &chunks), "aé🙂z");
  EXPECT_EQ(chunks, (std::vector<std::string>{"a", "", "é", "", "", "", "🙂", "z"}));
  // An unfinished character at the end becomes U+FFFD, like decode().
  std::vector<uint32_t> cut = {byte_id('a'), byte_id(0xE4), byte_id(0xBD)};
  EXPECT_EQ(tok.decode(cut), "a\xEF\xBF\xBD");
  EXPECT_EQ(stream_all(tok, cut, false), tok.decode(cut));
}

TEST(Streaming, RandomIdsMatchDecode) {
  DSA_FIXTURE_PATH(dir, "tokenizers/deepseek_v3");
  const Tokenizer tok = Tokenizer::from_file(dir);
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> any_id(0, 128814);
  std::uniform_int_distribution<uint32_t> byte_token(0, 255);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<uint32_t> ids;
    const int n = 1 + trial % 40;
    for (int i = 0; i < n; ++i) {
      // Mix whole tokens with single-byte tokens, which often form invalid or split UTF-8.
      ids.push_back(i % 3 == 0 ? any_id(rng) : *tok.token_to_id(byte_to_utf8()[byte_token(rng)]));
    }
    for (bool skip : {false, true}) EXPECT_EQ(stream_all(tok, ids, skip), tok.decode(ids, skip));
  }
}

TEST(Streaming, EncodedTextRoundTrips) {
  DSA_FIXTURE_PATH(dir, "tokenizers/deepseek_v3");
  const Tokenizer tok = Tokenizer::from_file(dir);
  const std::string text =
      "Grüße 👨‍👩‍👧‍👦 家族 🏳️‍🌈 العربية <｜User｜> done\n";
  const auto ids = tok.encode(text);
  EXPECT_EQ(stream_all(tok, ids, false), text);
  EXPECT_EQ(stream_all(tok, ids, true), tok.decode(ids, true));
  // The stream is reusable after finish().
  DecodeStream stream(tok);
  std::string a, b;
  for (uint32_t id : ids) stream.step(id, a);
  stream.finish(a);
  for (uint32_t id : ids) stream.step(id, b);
  stream.finish(b);
  EXPECT_EQ(a, b);
}

TEST(Utf8, LossyDecodingFollowsMaximalSubparts) {
  auto lossy = [](const std::string& s) {
    std::string out;
    append_utf8_lossy(s.data(), s.size(), out, true);
    return out;
  };
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(lossy("abc"), "abc");
  EXPECT_EQ(lossy("\x80"), r);
  EXPECT_EQ(lossy("\xC3"), r);
  EXPECT_EQ(lossy("\xE4\xBD"), r);  // one truncated sequence, one replacement
  EXPECT_EQ(lossy("\xE4\xBD"
                  "a"),
            r + "a");
  EXPECT_EQ(lossy("\xF0\x9F\x99"), r);
  EXPECT_EQ(lossy("\xF0\x80\x80"), r + r + r);  // F0 80 is not a valid start
  EXPECT_EQ(lossy("\xED\xA0\x80"), r + r + r);  // surrogates are invalid
  EXPECT_EQ(lossy("\xC0\xAF"), r + r);
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(lossy("\xFF"
                  "a\xE2\x82\xAC"),
            r + "a€");
  // Split decoding holds back only an unfinished sequence.
  std::string out;
  EXPECT_EQ(append_utf8_lossy("a\xE2\x82", 3, out, false), 1u);
  EXPECT_EQ(out, "a");
}

}  // namespace
}  // namespace dsaserve::tokenizer
