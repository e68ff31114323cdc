// The request-body parser's time on bodies of many keys and of many objects (server/json_body.h), each
// beside a body of the same size whose parse is plainly linear (arrays only: every value appended): 64,000
// keys against an array of the same 128,000 keys and values, 400,000 objects {"a":[1]} against as many
// arrays ["a",[1]]. The linear body's time is the row's floor; a linear parser measures about x1-x2, a
// quadratic one (nlohmann::ordered_json's own key search: 200k keys took 33 s) thousands. Fastest of
// `--runs` (default 5) each, interleaved, so that load on the machine slows both sides alike.
//   json_body_bench [--runs N]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "server/json_body.h"

namespace {

using dsaserve::server::parse_json_body;

double parse_seconds(const std::string& body, size_t want) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t got = parse_json_body(body, {}).size();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (got != want) {
    fmt::print(stderr, "json_body_bench: parsed {} entries, expected {}\n", got, want);
    std::exit(1);
  }
  return s;
}

std::string keys(int n, bool as_array) {
  std::string s = as_array ? "[" : "{";
  for (int i = 0; i < n; ++i) s += fmt::format("{}\"k{}\"{}{}", i ? "," : "", i, as_array ? "," : ":", i);
  return s + (as_array ? "]" : "}");
}

std::string objects(int n, bool as_array) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += std::string(i ? "," : "") + (as_array ? "[\"a\",[1]]" : "{\"a\":[1]}");
  return s + "]";
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else {
      fmt::print(stderr, "usage: json_body_bench [--runs N]\n");
      return 2;
    }
  }
  if (runs < 1) runs = 1;
  constexpr int kKeys = 64000, kObjects = 400000;
  const std::string k_obj = keys(kKeys, false), k_arr = keys(kKeys, true);
  const std::string o_obj = objects(kObjects, false), o_arr = objects(kObjects, true);
  double ko = 1e9, ka = 1e9, oo = 1e9, oa = 1e9;
  for (int r = 0; r < runs; ++r) {
    ko = std::min(ko, parse_seconds(k_obj, kKeys));
    ka = std::min(ka, parse_seconds(k_arr, 2 * kKeys));
    oo = std::min(oo, parse_seconds(o_obj, kObjects));
    oa = std::min(oa, parse_seconds(o_arr, kObjects));
  }
  fmt::print("| {:<40} | {:>10} | {:>10} | {:>6} |\n", "body (floor: the same size as arrays)", "ms",
             "floor ms", "ratio");
  fmt::print("|{:-<42}|{:->12}|{:->12}|{:->8}|\n", "", "", "", "");
  fmt::print("| {:<40} | {:>10.2f} | {:>10.2f} | {:>6.2f} |\n", "one object of 64,000 keys", ko * 1e3,
             ka * 1e3, ka / ko);
  fmt::print("| {:<40} | {:>10.2f} | {:>10.2f} | {:>6.2f} |\n", "an array of 400,000 objects", oo * 1e3,
             oa * 1e3, oa / oo);
  return 0;
}
