#include "common/fixtures.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

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

std::vector<int32_t> read_safetensors_i32(const std::filesystem::path& p, const std::string& name) {
  std::ifstream f(p, std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  const nlohmann::json j = nlohmann::json::parse(header);
  const auto& t = j.at(name);
  EXPECT_EQ(t.at("dtype"), "I32") << name << " in " << p;
  const size_t b = t["data_offsets"][0], e = t["data_offsets"][1];
  std::vector<int32_t> v((e - b) / 4);
  f.seekg(std::streamoff(8 + n + b));
  f.read(reinterpret_cast<char*>(v.data()), std::streamsize(e - b));
  return v;
}

}  // namespace dsaserve::testing
