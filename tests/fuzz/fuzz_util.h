#pragma once
// Shared by the libFuzzer targets (tests/fuzz): where the fixtures are, and the check that text a target
// produced is valid UTF-8 (what the JSON writer and clients need).
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include "tokenizer/utf8.h"

namespace dsaserve::fuzz {

// $DSASERVE_FIXTURES, else ../shared/fixtures beside the repository (as the tests read them).
inline std::filesystem::path fixtures_dir() {
  if (const char* env = std::getenv("DSASERVE_FIXTURES"); env != nullptr && *env != '\0') return env;
  return std::filesystem::path(DSASERVE_REPO_DIR).parent_path() / "shared" / "fixtures";
}

inline bool valid_utf8(std::string_view s) { return tokenizer::utf8_valid_prefix(s) == s.size(); }

// A failed property: abort, so that libFuzzer keeps the input.
#define DSA_FUZZ_CHECK(cond)                                                              \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "fuzz check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

}  // namespace dsaserve::fuzz
