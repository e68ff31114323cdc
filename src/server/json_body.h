#pragma once
// Request bodies -> JSON, in time linear in the body and within stated limits (nesting, keys per object,
// values in all), cancellable (server shutdown). Keys keep the client's order, as
// nlohmann::ordered_json's own parser does, but without its linear-time key insertion (quadratic for an
// object of many keys) or the callback parser's rescan of the parent after each nested value (quadratic
// for an array of objects). Also: text helpers that keep whatever a client sent printable in replies.
#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace dsaserve::server {

struct JsonLimits {
  int max_depth = 64;                     // nested arrays / objects
  int64_t max_object_keys = 65536;        // keys of one object
  int64_t max_values = int64_t(1) << 21;  // every value of the body (scalars, arrays and objects)
};

// Throws ApiError: 400 for invalid JSON (ill-formed UTF-8 in a string and out-of-range numbers included;
// `param` is the key whose value failed, at the top level) and for a limit exceeded (the message names
// it); 503 when `cancel` (may be null) becomes true while parsing.
nlohmann::ordered_json parse_json_body(std::string_view body, const JsonLimits& limits,
                                       const std::atomic<bool>* cancel = nullptr);

// Values (scalars, arrays and objects, `j` included), the most keys of any one object in `j`, and the bytes
// of its keys and string values, without the strings of the annotation keys "description", "title" and
// "$comment" (what a JSON schema turned into a grammar spells out as literals: names, const, enum, patterns).
// pattern_size: the largest expanded size (regex_expanded_size) of a string under a "pattern" key or a key of
// a "patternProperties" object.
struct JsonShape {
  int64_t values = 0;
  int64_t max_object_keys = 0;
  int64_t literal_bytes = 0;
  int64_t pattern_size = 0;
};

// The atoms a regular expression spells once its counted repetitions are written out: an atom (a character,
// an escape, a class) is 1, a group the sum of its alternatives, and `{n}` / `{n,}` / `{n,m}` multiply what
// they follow by their largest bound (`{n,}` by n + 1; `*`, `+` and `?` by 1). `(x{100}){100}` is 10,000. A
// grammar compiler writes counted repetitions out, in time that grows faster than their size (xgrammar:
// `x{4000}` 1.2 s, `x{20000}` 34 s). Saturates at INT64_MAX / 2.
int64_t regex_expanded_size(std::string_view re);
JsonShape json_shape(const nlohmann::ordered_json& j);

// `s` with every byte that is not part of well-formed UTF-8 (and every control character) written as
// \xNN: safe to put in a JSON reply or a log line.
std::string printable(std::string_view s);

// j.dump(), replacing ill-formed UTF-8 with U+FFFD instead of throwing.
std::string dump_json(const nlohmann::json& j);
std::string dump_json(const nlohmann::ordered_json& j);

}  // namespace dsaserve::server
