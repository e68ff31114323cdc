#pragma once
// Token-id input shared by the subcommands that take a token sequence (generate, score).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dsaserve::cli {

// Integers separated by commas, whitespace or JSON brackets; `origin` names the input in errors.
std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& origin);

// The ids in file `file` when it is non-empty (`file_flag` names its option in errors), else the ids
// given inline in `text` (option `text_flag`).
std::vector<int32_t> read_token_ids(const std::string& text, const std::string& text_flag,
                                    const std::string& file, const std::string& file_flag);

// Throws dsaserve::Error unless every id lies in [0, vocab_size).
void check_token_ids(std::span<const int32_t> ids, int64_t vocab_size);

}  // namespace dsaserve::cli
