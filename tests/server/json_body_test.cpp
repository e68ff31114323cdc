// The request-body JSON parser (server/json_body.h): same values as nlohmann's parser, key order kept,
// duplicates resolved as Python's json does, limits and cancellation, linear time on many keys and on
// arrays of objects; printable() and dump_json() on bytes that are not UTF-8.
#include "server/json_body.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

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

// 200k keys took 33 s with nlohmann::ordered_json's parser; an array of objects was quadratic too.
// Seconds of one parse of `body`, which must give `want` entries.
double parse_seconds(const std::string& body, size_t want) {
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(parse_json_body(body, {}).size(), want);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Parse time grows linearly with the keys of an object and the objects of an array. Each is timed against
// a body of the same size whose parse is plainly linear (arrays only: every value appended): 64,000 keys
// against an array of the same 128,000 keys and values, 400,000 objects {"a":[1]} against as many arrays
// ["a",[1]]. Same sizes, so cache and allocation effects fall on both sides alike; a linear parser measures
// about x1-x2 here, a quadratic one (nlohmann::ordered_json's key search: 200k keys took 33 s) thousands.
// The fastest of five runs each, interleaved, so that load on the machine slows both sides alike.
TEST(JsonBody, LinearInManyKeysAndInArraysOfObjects) {
  auto keys = [](int n, bool as_array) {
    std::string s = as_array ? "[" : "{";
    for (int i = 0; i < n; ++i) s += fmt::format("{}\"k{}\"{}{}", i ? "," : "", i, as_array ? "," : ":", i);
    return s + (as_array ? "]" : "}");
  };
  auto objects = [](int n, bool as_array) {
    std::string s = "[";
    for (int i = 0; i < n; ++i) s += std::string(i ? "," : "") + (as_array ? "[\"a\",[1]]" : "{\"a\":[1]}");
    return s + "]";
  };
  constexpr int kKeys = 64000, kObjects = 400000;
  const std::string k_obj = keys(kKeys, false), k_arr = keys(kKeys, true);
  const std::string o_obj = objects(kObjects, false), o_arr = objects(kObjects, true);
  double ko = 1e9, ka = 1e9, oo = 1e9, oa = 1e9;
  for (int r = 0; r < 5; ++r) {
    ko = std::min(ko, parse_seconds(k_obj, kKeys));
    ka = std::min(ka, parse_seconds(k_arr, 2 * kKeys));
    oo = std::min(oo, parse_seconds(o_obj, kObjects));
    oa = std::min(oa, parse_seconds(o_arr, kObjects));
  }
  std::printf(
      "RESULT json_body 64,000 keys %.4f s vs the same as an array %.4f s (x%.2f); 400,000 objects %.4f s vs "
      "as arrays %.4f s (x%.2f)\n",
      ko, ka, ko / ka, oo, oa, oo / oa);
  EXPECT_LT(ko, 8 * ka);
  EXPECT_LT(oo, 8 * oa);
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

}  // namespace
}  // namespace dsaserve::server
