// The request-body JSON parser (server/json_body.h): same values as nlohmann's parser, key order kept,
// duplicates resolved as Python's json does, limits and cancellation, bodies of many keys and of arrays of
// many objects (their time: bench/json_body_bench); printable() and dump_json() on bytes that are not UTF-8.
#include "server/json_body.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <limits>

#include "server/openai.h"

namespace dsaserve::server {
namespace {

using ojson = nlohmann::ordered_json;

int error_status(const std::string& body, const JsonLimits& limits = {}, std::string* param = nullptr) {
  try {
    parse_json_body(body, limits);
  } catch (const ApiError& e) {
    if (param) *param = e.param;
    return e.status;
  }
  return 0;
}

TEST(JsonBody, SameValuesAsNlohmannInTheClientsKeyOrder) {
  const std::string text =
      R"({"z":1,"a":[1,-2,3.5,"s\u00e9",true,null,{"y":{},"b":[]}],"m":{"k2":1,"k1":2},"big":18446744073709551615})";
  const ojson got = parse_json_body(text, {});
  EXPECT_EQ(got, ojson::parse(text));
  EXPECT_EQ(got.dump(), ojson::parse(text).dump()) << "key order";
  EXPECT_TRUE(got["big"].is_number_unsigned());
  EXPECT_EQ(parse_json_body("  7 ", {}), 7);
}

TEST(JsonBody, DuplicateKeysKeepTheFirstPlaceAndTheLastValue) {
  EXPECT_EQ(parse_json_body(R"({"a":1,"b":2,"a":3})", {}).dump(), R"({"a":3,"b":2})");
  std::string many = "{";
  for (int i = 0; i < 100; ++i) many += fmt::format("\"k{}\":{},", i, i);
  many += "\"k5\":\"last\"}";
  const ojson j = parse_json_body(many, {});
  EXPECT_EQ(j.size(), 100u);
  EXPECT_EQ(j["k5"], "last");
  EXPECT_EQ(j.begin().key(), "k0");
}

TEST(JsonBody, InvalidJsonAndBytesAreA400NamingTheField) {
  std::string param;
  EXPECT_EQ(error_status("{\"prompt\":\"\xff\"}", {}, &param), 400);
  EXPECT_EQ(param, "prompt");
  EXPECT_EQ(error_status(R"({"max_tokens":1e400})", {}, &param), 400);
  EXPECT_EQ(param, "max_tokens");
  EXPECT_EQ(error_status("{\"a\":1", {}), 400);
  EXPECT_EQ(error_status("[1,2]x", {}), 400);
  EXPECT_EQ(error_status("", {}), 400);
  try {
    parse_json_body("{\"a\":\"\xc3(\"}", {});
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_NO_THROW(nlohmann::json(e.body()).dump()) << "the message must be valid UTF-8";
    EXPECT_NE(std::string(e.what()).find("UTF-8"), std::string::npos) << e.what();
  }
}

TEST(JsonBody, LimitsAreEnforced) {
  JsonLimits l;
  l.max_depth = 3;
  l.max_object_keys = 4;
  l.max_values = 10;
  EXPECT_EQ(error_status("[[[1]]]", l), 0);
  EXPECT_EQ(error_status("[[[[1]]]]", l), 400);
  EXPECT_EQ(error_status(R"({"a":1,"b":2,"c":3,"d":4})", l), 0);
  std::string param;
  EXPECT_EQ(error_status(R"({"x":{"a":1,"b":2,"c":3,"d":4,"e":5}})", l, &param), 400);
  EXPECT_EQ(param, "x");
  EXPECT_EQ(error_status("[1,2,3,4,5,6,7,8,9]", l), 0);
  EXPECT_EQ(error_status("[1,2,3,4,5,6,7,8,9,10]", l), 400);
}

TEST(JsonBody, CancelledParsingIs503) {
  std::atomic<bool> cancel{true};
  std::string big = "[0";
  for (int i = 0; i < 10000; ++i) big += ",0";
  big += "]";
  try {
    parse_json_body(big, {}, &cancel);
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 503);
  }
}

// Bodies of many keys and of arrays of many objects (where nlohmann::ordered_json's own parser is
// quadratic: 200k keys took 33 s) parse to the same values as nlohmann's parser, in the client's key order,
// with a duplicate key's last value in its first place. Their parse time beside same-size linear bodies is
// bench/json_body_bench's table (README: a benchmark, not a timed test).
TEST(JsonBody, ManyKeysAndArraysOfObjects) {
  constexpr int kKeys = 64000, kObjects = 40000;
  std::string body = "{";
  for (int i = 0; i < kKeys; ++i) body += fmt::format("{}\"k{}\":{}", i ? "," : "", i, i);
  body += ",\"k17\":\"last\"}";
  const ojson keys = parse_json_body(body, {});
  ASSERT_EQ(keys.size(), size_t(kKeys));
  int64_t i = 0;
  for (const auto& [k, v] : keys.items()) {
    ASSERT_EQ(k, fmt::format("k{}", i)) << i;
    if (i == 17) {
      EXPECT_EQ(v, "last");
    } else {
      ASSERT_EQ(v, i) << i;
    }
    ++i;
  }
  std::string objects = "[";
  for (int j = 0; j < kObjects; ++j)
    objects += fmt::format("{}{{\"a\":[{}],\"b\":{{\"c\":{}}}}}", j ? "," : "", j, -j);
  objects += "]";
  const ojson arr = parse_json_body(objects, {});
  EXPECT_EQ(arr, ojson::parse(objects));
  ASSERT_EQ(arr.size(), size_t(kObjects));
  EXPECT_EQ(arr[kObjects - 1]["b"]["c"], -(kObjects - 1));
}

TEST(JsonBody, PrintableAndDumpJsonNeverThrow) {
  EXPECT_EQ(printable("a\xff"
                      "b\xc3\xa9\x01"),
            "a\\xFFb\xc3\xa9\\x01");
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xED\\xA0\\x80");  // a surrogate
  EXPECT_EQ(printable("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
  EXPECT_EQ(printable("\xe2\x82"), "\\xE2\\x82");
  const nlohmann::json j = {{"m", "x\xff"}};
  EXPECT_THROW((void)j.dump(), nlohmann::json::type_error);
  EXPECT_EQ(dump_json(j), "{\"m\":\"x\xef\xbf\xbd\"}");
}

TEST(JsonBody, RegexExpandedSizeCountsWrittenOutRepetitions) {
  EXPECT_EQ(regex_expanded_size(""), 0);
  EXPECT_EQ(regex_expanded_size("abc"), 3);
  EXPECT_EQ(regex_expanded_size("^x{20000}$"), 20000);
  EXPECT_EQ(regex_expanded_size("(x|y){5000}"), 10000);  // a group: the sum of its alternatives
  EXPECT_EQ(regex_expanded_size("(x{100}){100}"), 10000);
  EXPECT_EQ(regex_expanded_size("[a-z]{0,2000}"), 2000);
  EXPECT_EQ(regex_expanded_size("a{3,}"), 4);
  EXPECT_EQ(regex_expanded_size("a*b+c?"), 3);
  // Escapes and classes are one atom; a '{' that opens no count is a literal; a ']' first in a class is a
  // member.
  EXPECT_EQ(regex_expanded_size(R"(\{5\})"), 3);
  EXPECT_EQ(regex_expanded_size("[]{}]{4}"), 4);
  EXPECT_EQ(regex_expanded_size("a{x}"), 4);
  // The real world's patterns stay small: a UUID, a date-time.
  EXPECT_EQ(regex_expanded_size("^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"), 36);
  EXPECT_EQ(regex_expanded_size(R"(^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}$)"), 19);
  // Saturates instead of overflowing; unbalanced groups still count.
  EXPECT_EQ(regex_expanded_size("((((x{99999999}){99999999}){99999999}){99999999})"),
            std::numeric_limits<int64_t>::max() / 2);
  EXPECT_EQ(regex_expanded_size("((ab"), 2);
  EXPECT_EQ(regex_expanded_size("a{99999999999999999999999}"), std::numeric_limits<int64_t>::max() / 2);
}

// json_shape: the literals' bytes leave descriptions and titles aside; the largest pattern.
TEST(JsonBody, ShapeOfAGrammarSource) {
  const ojson schema = ojson::parse(
      R"({"type": "object", "description": "dddddddddd", "title": "tt",
          "properties": {"a": {"type": "string", "pattern": "x{300}"}, "b": {"enum": ["xyz", 1]}}})");
  const JsonShape shape = json_shape(schema);
  EXPECT_EQ(shape.values, 12);
  EXPECT_EQ(shape.max_object_keys, 4);
  // keys: type description title properties a type pattern b enum = 4+11+5+10+1+4+7+1+4; strings: object
  // string x{300} xyz = 6+6+6+3
  EXPECT_EQ(shape.literal_bytes, 47 + 21);
  EXPECT_EQ(shape.pattern_size, 300);
  EXPECT_EQ(json_shape(ojson::parse(R"({"patternProperties": {"^a{5000}$": {}, "b": {}}})")).pattern_size,
            5000);
}

}  // namespace
}  // namespace dsaserve::server
