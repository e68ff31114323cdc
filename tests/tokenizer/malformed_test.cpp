// Malformed tokenizer files give a dsaserve::Error whose message names the file and the field.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace dsaserve::tokenizer {
namespace {

// A valid minimal byte-level tokenizer with `patch` spliced in as extra top-level members (later keys
// are not allowed in JSON twice, so the base leaves out what a case replaces).
std::string minimal(const std::string& model, const std::string& rest = R"("pre_tokenizer": null)") {
  return "{" + rest + ", \"model\": " + model + "}";
}

constexpr const char* kGoodModel =
    R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";

void expect_error(const std::string& json, const std::string& needle) {
  try {
    Tokenizer::from_json(json, "test.json");
    ADD_FAILURE() << "expected an error containing \"" << needle << "\" for " << json;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("test.json: "), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected: " << needle;
  }
}

TEST(Malformed, MinimalIsValid) {
  const Tokenizer tok = Tokenizer::from_json(minimal(kGoodModel));
  EXPECT_EQ(tok.encode("abab"), (std::vector<uint32_t>{2, 2}));  // no pre-tokenizer: one word
  EXPECT_EQ(tok.encode("aab"), (std::vector<uint32_t>{0, 2}));
}

TEST(Malformed, NamesTheField) {
  expect_error("{not json", "not valid JSON");
  expect_error("[1, 2]", "expected a JSON object");
  expect_error(R"({"pre_tokenizer": null})", "model: missing");
  expect_error(minimal(R"({"type": "WordPiece", "vocab": {}})"), "model.type: only \"BPE\"");
  expect_error(minimal(R"({"type": "BPE", "merges": []})"), "model.vocab: missing");
  expect_error(minimal(R"({"type": "BPE", "vocab": [], "merges": []})"), "model.vocab: expected an object");
  expect_error(minimal(R"({"type": "BPE", "vocab": {"a": -1}, "merges": []})"),
               "model.vocab[\"a\"]: expected a non-negative");
  expect_error(minimal(R"({"type": "BPE", "vocab": {"a": "x"}, "merges": []})"), "model.vocab[\"a\"]");
  expect_error(minimal(R"({"type": "BPE", "vocab": {"a": 0}})"), "model.merges: missing");
  expect_error(minimal(R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b", "ab"]})"),
               "model.merges[1]: expected \"left right\"");
  expect_error(minimal(R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b", "c"]]})"),
               "model.merges[0]: expected a string");
  expect_error(minimal(R"({"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a z"]})"),
               "model.merges[0]: token \"z\" is not in model.vocab");
  expect_error(minimal(R"({"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [["a", "b"]]})"),
               "model.merges[0]: merged token \"ab\" is not in model.vocab");
  expect_error(minimal(R"({"type": "BPE", "vocab": {"a": 0}, "merges": [], "unk_token": "<unk>"})"),
               "model.unk_token: \"<unk>\" is not in model.vocab");
  expect_error(minimal(R"({"type": "BPE", "vocab": {"a": 0}, "merges": [], "dropout": 0.1})"),
               "model.dropout");
  expect_error(minimal(R"({"type": "BPE", "vocab": {"a": 0}, "merges": [], "fuse_unk": "yes"})"),
               "model.fuse_unk: expected a boolean");
}

TEST(Malformed, PipelineSections) {
  expect_error(
      minimal(kGoodModel, R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Nope"}]})"),
      "pre_tokenizer.pretokenizers[0].type: pre-tokenizer \"Nope\" is not supported");
  expect_error(
      minimal(
          kGoodModel,
          R"("pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"})"),
      "pre_tokenizer.pattern: invalid regex");
  expect_error(
      minimal(kGoodModel,
              R"("pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways"})"),
      "pre_tokenizer.behavior: unknown split behavior \"Sideways\"");
  expect_error(
      minimal(kGoodModel, R"("pre_tokenizer": {"type": "Split", "pattern": 3, "behavior": "Isolated"})"),
      "pre_tokenizer.pattern: expected");
  expect_error(minimal(kGoodModel, R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": 1})"),
               "pre_tokenizer.add_prefix_space: expected a boolean");
  expect_error(minimal(kGoodModel, R"("normalizer": {"type": "NFKC"})"),
               "normalizer.type: normalizer \"NFKC\" is not supported");
  expect_error(minimal(kGoodModel, R"("decoder": {"type": "Sequence", "decoders": [{"type": "CTC"}]})"),
               "decoder.decoders[0].type: decoder \"CTC\" is not supported");
  expect_error(minimal(kGoodModel, R"("decoder": {"no_type": 1})"), "decoder.type: missing");
  expect_error(minimal(kGoodModel, R"("added_tokens": {})"), "added_tokens: expected an array");
  expect_error(minimal(kGoodModel, R"("added_tokens": [{"id": 3}])"), "added_tokens[0].content: missing");
  expect_error(minimal(kGoodModel, R"("added_tokens": [{"id": -3, "content": "x"}])"),
               "added_tokens[0].id: expected a non-negative");
  expect_error(minimal(kGoodModel, R"("added_tokens": [{"id": 3, "content": "x", "lstrip": "no"}])"),
               "added_tokens[0].lstrip: expected a boolean");
}

TEST(Malformed, MissingFile) {
  try {
    Tokenizer::from_file("/nonexistent/dir/tokenizer.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/tokenizer.json: cannot open"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dsaserve::tokenizer
