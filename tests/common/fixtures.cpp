#include "common/fixtures.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>

namespace dsaserve::testing {

std::filesystem::path repo_dir() {
  if (const char* e = std::getenv("DSASERVE_REPO")) return e;
  return DSASERVE_REPO_DIR;
}

std::filesystem::path fixtures_dir() {
  if (const char* e = std::getenv("DSASERVE_FIXTURES")) return e;
  return repo_dir().parent_path() / "shared" / "fixtures";
}

std::filesystem::path dsaserve_binary() {
  if (const char* e = std::getenv("DSASERVE_BIN")) return std::filesystem::path(e) / "dsaserve";
  return std::filesystem::path(DSASERVE_BIN_DIR) / "dsaserve";
}

int run_command(const std::string& cmd, std::string* output) {
  output->clear();
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return -1;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) output->append(buf.data(), n);
  const int status = pclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace dsaserve::testing
