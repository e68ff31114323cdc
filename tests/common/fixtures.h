#pragma once
// Where the reference fixtures live: $DSASERVE_FIXTURES, else ../shared/fixtures beside the repository.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace dsaserve::testing {

std::filesystem::path repo_dir();
std::filesystem::path fixtures_dir();
// The built dsaserve binary (compiled-in build path; $DSASERVE_BIN overrides the folder) (for end-to-end
// tests that run the real program).
std::filesystem::path dsaserve_binary();
// Runs a shell command, returns its exit status and fills `output` with stdout+stderr.
int run_command(const std::string& cmd, std::string* output);
// One I32 tensor of a safetensors file (for tests that do not link the io module); a test failure when the
// tensor is not I32.
std::vector<int32_t> read_safetensors_i32(const std::filesystem::path& p, const std::string& name);

}  // namespace dsaserve::testing

// Declares `var` = fixtures_dir() / rel, or skips the current test (saying how to get the fixtures)
// when that path does not exist. Use at the top of a TEST body.
#define DSA_FIXTURE_PATH(var, rel)                                                               \
  const std::filesystem::path var = ::dsaserve::testing::fixtures_dir() / (rel);                 \
  if (!std::filesystem::exists(var))                                                             \
  GTEST_SKIP() << "fixture " << var << " missing: set DSASERVE_FIXTURES to the shared fixtures " \
               << "folder (../shared/fixtures beside the repository)"
