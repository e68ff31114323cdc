#include "cli/token_ids.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace dsaserve::cli {

std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& origin) {
  std::string cleaned = text;
  for (char& ch : cleaned) {
    if (ch == ',' || ch == '[' || ch == ']' || ch == '\n' || ch == '\r' || ch == '\t') ch = ' ';
  }
  std::istringstream in(cleaned);
  std::vector<int32_t> ids;
  std::string tok;
  while (in >> tok) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DSA_CHECK(used == tok.size() && v >= INT32_MIN && v <= INT32_MAX, "{}: '{}' is not a token id", origin,
              tok);
    ids.push_back(int32_t(v));
  }
  return ids;
}

std::vector<int32_t> read_token_ids(const std::string& text, const std::string& text_flag,
                                    const std::string& file, const std::string& file_flag) {
  if (file.empty()) return parse_token_ids(text, text_flag);
  std::ifstream f(file);
  DSA_CHECK(f.good(), "{}: cannot read '{}'", file_flag, file);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_token_ids(ss.str(), file);
}

void check_token_ids(std::span<const int32_t> ids, int64_t vocab_size) {
  for (size_t i = 0; i < ids.size(); ++i) {
    DSA_CHECK(ids[i] >= 0 && ids[i] < vocab_size, "token id {} at index {} is out of range [0, {})", ids[i],
              i, vocab_size);
  }
}

}  // namespace dsaserve::cli
