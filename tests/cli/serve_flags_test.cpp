// issue 19, item 10: flags and files that used to be accepted or hang: --port out of range,
// --max-body-bytes <= 0, error lines on stdout, a FIFO in place of model.safetensors (the real binary).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "common/fixtures.h"

namespace dsaserve {
namespace {

using testing::dsaserve_binary;
using testing::run_command;

TEST(ServeFlags, PortMustBeInRange) {
  for (const char* port : {"70000", "-1", "65536"}) {
    std::string out;
    const int rc = run_command(
        fmt::format("timeout 60 {} serve --model builtin --port {}", dsaserve_binary().string(), port), &out);
    EXPECT_NE(rc, 0) << port << ": " << out;
    EXPECT_NE(rc, 124) << port << ": it should not start serving";
    EXPECT_NE(out.find("--port"), std::string::npos) << out;
  }
}

TEST(ServeFlags, MaxBodyBytesMustBePositive) {
  for (const char* n : {"-1", "0"}) {
    std::string out;
    const int rc = run_command(
        fmt::format("timeout 60 {} serve --model builtin --max-body-bytes {}", dsaserve_binary().string(), n),
        &out);
    EXPECT_NE(rc, 0) << n << ": " << out;
    EXPECT_NE(rc, 124) << n << ": it should not start serving";
    EXPECT_NE(out.find("--max-body-bytes"), std::string::npos) << out;
  }
}

// "error: ..." lines go to stderr; stdout carries only a command's output.
TEST(ServeFlags, ErrorLinesGoToStderr) {
  const std::string cmd = fmt::format("{} inspect --model /nonexistent/model", dsaserve_binary().string());
  std::string both, stdout_only;
  EXPECT_EQ(run_command(cmd, &both), 1);
  EXPECT_NE(both.find("error: "), std::string::npos) << both;
  EXPECT_EQ(run_command("{ " + cmd + " 2>/dev/null; }", &stdout_only), 1);
  EXPECT_EQ(stdout_only, "") << "an error line went to stdout";
}

// A FIFO (or any non-regular file) as model.safetensors is refused instead of blocking in open().
TEST(ServeFlags, FifoAsSafetensorsIsRejected) {
  DSA_FIXTURE_PATH(tiny, "models/tiny");
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("dsaserve-fifo-{}", ::getpid());
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(tiny / "config.json", dir / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  ASSERT_EQ(::mkfifo((dir / "model.safetensors").c_str(), 0600), 0);
  for (const std::string& sub : {"inspect --model " + dir.string(),
                                 "serve --port 0 --tokenizer builtin:bytes --model " + dir.string()}) {
    std::string out;
    const int rc = run_command(fmt::format("timeout 60 {} {}", dsaserve_binary().string(), sub), &out);
    EXPECT_EQ(rc, 1) << sub << " (124: it hung): " << out;
    EXPECT_NE(out.find("not a regular file"), std::string::npos) << out;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dsaserve
