#pragma once
// Field access for tokenizer.json objects with errors that name the field
// ("pre_tokenizer.pretokenizers[2].behavior").
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

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

}  // namespace dsaserve::tokenizer
