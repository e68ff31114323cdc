#pragma once
// Python str semantics on UTF-8 strings (by code point where Python works by code point). Case
// mapping covers ASCII only.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsaserve::chat {

bool py_is_space(char32_t c);
// str.strip/lstrip/rstrip; chars == nullptr strips whitespace.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right);
// str.split / str.rsplit; sep == nullptr splits on runs of whitespace.
std::vector<std::string> py_split(const std::string& s, const std::string* sep, int64_t maxsplit,
                                  bool from_right);
std::vector<std::string> py_splitlines(const std::string& s, bool keepends);
std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count);
int64_t py_count(const std::string& s, const std::string& sub);
std::string py_upper(const std::string& s);
std::string py_lower(const std::string& s);
std::string py_title(const std::string& s);                         // str.title()
std::string py_capitalize(const std::string& s);                    // str.capitalize()
bool py_is_class(const std::string& s, const std::string& method);  // isdigit, isalpha, ...
// jinja2 filters with their own text rules.
std::string jinja_title(const std::string& s);
int64_t jinja_wordcount(const std::string& s);
std::string html_escape(const std::string& s);
// The inside of a JSON string literal for UTF-8 text `s` (no quotes; control characters as \u00XX,
// everything else, non-ASCII included, kept as it is).
std::string json_escape(std::string_view s);

}  // namespace dsaserve::chat
