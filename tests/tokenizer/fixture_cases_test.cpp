// Every case of tokenizer_cases.jsonl (HF tokenizers' output on the DeepSeek-V3 tokenizer) reproduced
// exactly: ids, decode and decode with skip_special_tokens; plus load time and lookups.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/fixtures.h"
#include "core/error.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace dsaserve::tokenizer {
namespace {

using nlohmann::json;

std::vector<json> read_cases(const std::filesystem::path& path) {
  std::vector<json> cases;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) cases.push_back(json::parse(line));
  }
  return cases;
}

TEST(FixtureCases, DeepSeekV3EncodeDecodeExact) {
  DSA_FIXTURE_PATH(dir, "tokenizers/deepseek_v3");
  DSA_FIXTURE_PATH(cases_path, "text/tokenizer_cases.jsonl");
  const Tokenizer tok = Tokenizer::from_file(dir);
  const auto cases = read_cases(cases_path);
  ASSERT_GE(cases.size(), 50u);
  for (const json& c : cases) {
    const std::string text = c["text"];
    const auto expected = c["ids"].get<std::vector<uint32_t>>();
    const auto ids = tok.encode(text);
    EXPECT_EQ(ids, expected) << "text: " << text;
    EXPECT_EQ(tok.decode(expected, false), c["decoded"].get<std::string>()) << "text: " << text;
    EXPECT_EQ(tok.decode(expected, true), c["decoded_skip_special"].get<std::string>()) << "text: " << text;
    // Streaming the same ids gives the same text.
    for (bool skip : {false, true}) {
      DecodeStream stream(tok, skip);
      std::string streamed;
      for (uint32_t id : expected) stream.step(id, streamed);
      stream.finish(streamed);
      EXPECT_EQ(streamed, tok.decode(expected, skip)) << "text: " << text;
    }
  }
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

TEST(FixtureCases, LoadsAndPrintsItsTime) {
  DSA_FIXTURE_PATH(file, "tokenizers/deepseek_v3/tokenizer.json");
  // CPU time of the loading thread: what loading costs, whatever else the machine is running.
  const double cpu0 = thread_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  const Tokenizer tok = Tokenizer::from_file(file);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = thread_cpu_seconds() - cpu0;
  std::printf("[ load ] deepseek_v3 tokenizer.json (7.8 MB): %.3f s CPU, %.3f s wall\n", cpu, wall);
  EXPECT_EQ(tok.vocab_size(), 128815u);
}

TEST(FixtureCases, LookupsAndSpecialTokens) {
  DSA_FIXTURE_PATH(dir, "tokenizers/deepseek_v3");
  const Tokenizer tok = Tokenizer::from_file(dir);
  EXPECT_EQ(tok.token_to_id("<｜begin▁of▁sentence｜>"), 0u);
  EXPECT_EQ(tok.token_to_id("<｜tool▁sep｜>"), 128814u);
  EXPECT_EQ(tok.id_to_token(0), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(tok.token_to_id("Ġthe"), tok.encode(" the").at(0));
  EXPECT_FALSE(tok.token_to_id("not a token at all").has_value());
  EXPECT_FALSE(tok.id_to_token(999999).has_value());
  EXPECT_TRUE(tok.is_special(0));
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_FALSE(tok.is_special(128814));  // <｜tool▁sep｜> is an added but not special token
  EXPECT_FALSE(tok.is_special(tok.encode("hello").at(0)));

  // Special tokens are parsed by default, spelled out by the model otherwise; <｜User｜> is an added
  // token that is not special, so it is matched either way.
  const std::string text = "<｜begin▁of▁sentence｜><｜User｜>hi<｜end▁of▁sentence｜>";
  const auto parsed = tok.encode(text);
  ASSERT_EQ(parsed.size(), 4u);
  EXPECT_EQ(parsed[0], 0u);
  EXPECT_EQ(parsed[1], *tok.token_to_id("<｜User｜>"));
  EXPECT_EQ(parsed[3], 1u);
  const auto spelled = tok.encode(text, /*parse_special=*/false);
  EXPECT_GT(spelled.size(), 6u);
  for (uint32_t id : spelled) EXPECT_FALSE(tok.is_special(id));
  EXPECT_NE(std::find(spelled.begin(), spelled.end(), parsed[1]), spelled.end());
  EXPECT_EQ(tok.decode(spelled), text);
  EXPECT_EQ(tok.decode(parsed, /*skip_special_tokens=*/true), "<｜User｜>hi");
  // Unknown ids are skipped, as HF does.
  EXPECT_EQ(tok.decode(std::vector<uint32_t>{parsed[2], 4000000000u}), "hi");
}

TEST(FixtureCases, InvalidUtf8InputIsAnError) {
  DSA_FIXTURE_PATH(dir, "tokenizers/deepseek_v3");
  const Tokenizer tok = Tokenizer::from_file(dir);
  try {
    tok.encode(std::string("ok \xC3\x28 bad"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8 (byte offset 3)"), std::string::npos) << e.what();
  }
}

TEST(FixtureCases, LongWordsAndThreads) {
  DSA_FIXTURE_PATH(dir, "tokenizers/deepseek_v3");
  const Tokenizer tok = Tokenizer::from_file(dir);
  // A long single word exercises the heap merge; the text must round-trip.
  std::string word;
  for (int i = 0; i < 500; ++i) word += "abcdefghij"[i * 7 % 10];
  const auto ids = tok.encode(word);
  EXPECT_EQ(tok.decode(ids), word);
  // Threads share one tokenizer and get the same ids.
  std::vector<std::thread> threads;
  std::vector<std::vector<uint32_t>> results(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 50; ++k) results[t] = tok.encode(word + " and some more text 123");
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& r : results) EXPECT_EQ(r, results[0]);
}

}  // namespace
}  // namespace dsaserve::tokenizer
