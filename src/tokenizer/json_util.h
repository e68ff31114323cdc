#pragma once
// Field access for tokenizer.json objects with errors that name the field
// ("pre_tokenizer.pretokenizers[2].behavior").
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "tokenizer/regex.h"

namespace dsaserve::tokenizer {

inline const nlohmann::json& required_field(const nlohmann::json& obj, const char* key,
                                            const std::string& where) {
  if (!obj.is_object()) fail("{}: expected an object, got {}", where, obj.type_name());
  auto it = obj.find(key);
  if (it == obj.end()) fail("{}.{}: missing", where, key);
  return *it;
}

inline std::string string_field(const nlohmann::json& obj, const char* key, const std::string& where) {
  const auto& v = required_field(obj, key, where);
  if (!v.is_string()) fail("{}.{}: expected a string, got {}", where, key, v.type_name());
  return v.get<std::string>();
}

inline bool bool_field(const nlohmann::json& obj, const char* key, const std::string& where, bool fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail("{}.{}: expected a boolean, got {}", where, key, it->type_name());
  return it->get<bool>();
}

inline const nlohmann::json& array_field(const nlohmann::json& obj, const char* key,
                                         const std::string& where) {
  const auto& v = required_field(obj, key, where);
  if (!v.is_array()) fail("{}.{}: expected an array, got {}", where, key, v.type_name());
  return v;
}

// The regex of a {"String": ...} (matched literally) or {"Regex": ...} "pattern" member.
inline std::string pattern_regex(const nlohmann::json& spec, const std::string& where) {
  const auto& p = required_field(spec, "pattern", where);
  if (p.is_object() && p.contains("Regex") && p["Regex"].is_string()) return p["Regex"].get<std::string>();
  if (p.is_object() && p.contains("String") && p["String"].is_string()) {
    return regex_escape(p["String"].get_ref<const std::string&>());
  }
  fail("{}.pattern: expected {{\"String\": ...}} or {{\"Regex\": ...}}, got {}", where, p.dump());
}

}  // namespace dsaserve::tokenizer
