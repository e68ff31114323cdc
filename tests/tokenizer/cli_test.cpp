// End to end: the real `dsaserve tokenize` / `detokenize` commands on JSON lines.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/fixtures.h"

namespace dsaserve::tokenizer {
namespace {

using dsaserve::testing::dsaserve_binary;
using dsaserve::testing::run_command;

TEST(Cli, TokenizeAndDetokenize) {
  DSA_FIXTURE_PATH(dir, "tokenizers/deepseek_v3");
  const std::string bin = dsaserve_binary().string();
  std::string out;
  ASSERT_EQ(run_command("printf '{\"text\": \"hello world\"}\\n\\n{\"text\": \"<｜end▁of▁sentence｜>\", "
                        "\"parse_special\": false}\\n{\"text\": \"<｜end▁of▁sentence｜>\"}\\n' | " +
                            bin + " tokenize --tokenizer " + dir.string(),
                        &out),
            0)
      << out;
  EXPECT_EQ(out.substr(0, out.find('\n')), "{\"ids\": [33310, 2058]}");
  EXPECT_NE(out.find("\n{\"ids\": [1]}\n"), std::string::npos) << out;
  ASSERT_EQ(run_command("printf '{\"ids\": [0, 33310, 2058]}\\n{\"ids\": [0, 33310], "
                        "\"skip_special_tokens\": true}\\n' | " +
                            bin + " detokenize --stream --tokenizer " + dir.string(),
                        &out),
            0)
      << out;
  EXPECT_EQ(out,
            "{\"chunks\":[\"<｜begin▁of▁sentence｜>\",\"hello\",\" "
            "world\",\"\"],\"text\":\"<｜begin▁of▁sentence｜>hello "
            "world\"}\n{\"chunks\":[\"\",\"hello\",\"\"],\"text\":\"hello\"}\n");
}

TEST(Cli, BadInputNamesTheLine) {
  DSA_FIXTURE_PATH(dir, "tokenizers/deepseek_v3");
  const std::string bin = dsaserve_binary().string();
  std::string out;
  EXPECT_EQ(run_command("printf '{\"text\": \"ok\"}\\n{\"text\": 3}\\n' | " + bin + " tokenize --tokenizer " +
                            dir.string(),
                        &out),
            1);
  EXPECT_NE(out.find("stdin line 2: expected {\"text\": string}"), std::string::npos) << out;
  EXPECT_EQ(
      run_command("printf '{\"ids\": [-1]}\\n' | " + bin + " detokenize --tokenizer " + dir.string(), &out),
      1);
  EXPECT_NE(out.find("stdin line 1: ids must be non-negative 32-bit integers"), std::string::npos) << out;
  EXPECT_EQ(run_command("printf 'not json\\n' | " + bin + " detokenize --tokenizer " + dir.string(), &out),
            1);
  EXPECT_NE(out.find("stdin line 1: not valid JSON"), std::string::npos) << out;
  EXPECT_EQ(run_command(bin + " tokenize --tokenizer /nonexistent/tok < /dev/null", &out), 1);
  EXPECT_NE(out.find("/nonexistent/tok: cannot open tokenizer file"), std::string::npos) << out;
}

// A reader that goes away (`| head -c 1`) ends the command with an error naming stdout, in bounded time,
// never SIGPIPE killing it (status 141 under pipefail) nor tokenizing the rest of stdin for nobody.
TEST(Cli, AClosedStdoutIsAnErrorNotSigpipe) {
  DSA_FIXTURE_PATH(dir, "tokenizers/deepseek_v3");
  std::string out;
  EXPECT_EQ(run_command(
                "bash -c 'set -o pipefail; yes \"{\\\"text\\\": \\\"hello world\\\"}\" | head -n 300000 | " +
                    dsaserve_binary().string() + " tokenize --tokenizer " + dir.string() +
                    " | head -c 1 > /dev/null'",
                &out),
            1)
      << out;
  EXPECT_NE(out.find("error: cannot write to stdout: Broken pipe"), std::string::npos) << out;
}

// chat-template --jsonl reads stdin line by line like tokenize: the same error when its reader goes away.
TEST(Cli, ChatTemplateJsonlStopsWhenItsReaderGoesAway) {
  std::string out;
  EXPECT_EQ(
      run_command("bash -c 'set -o pipefail; yes \"{\\\"template\\\": \\\"hello\\\"}\" | head -n 300000 | " +
                      dsaserve_binary().string() + " chat-template --jsonl | head -c 1 > /dev/null'",
                  &out),
      1)
      << out;
  EXPECT_NE(out.find("error: cannot write to stdout: Broken pipe"), std::string::npos) << out;
}

// Every command's stdout is checked when it ends (main.cpp): output that could not be written is exit status
// 1 and an error, not a success with the output lost. /dev/full fails every write (ENOSPC).
TEST(Cli, OutputThatCannotBeWrittenIsAnError) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this machine";
  DSA_FIXTURE_PATH(cfg, "configs/glm-5.3.json");
  std::string out;
  // A subshell: run_command sends the command's stderr (the error) to its pipe, its stdout to /dev/full.
  std::string cmd = "(";
  cmd += dsaserve_binary().string() + " plan --config " + cfg.string() + " > /dev/full)";
  EXPECT_EQ(run_command(cmd, &out), 1) << out;
  EXPECT_NE(out.find("error: cannot write to stdout: "), std::string::npos) << out;
  // The same command with a writable stdout succeeds (the failure above is the output's, not the command's).
  EXPECT_EQ(
      run_command(dsaserve_binary().string() + " plan --config " + cfg.string() + " > /dev/null 2>&1", &out),
      0)
      << out;
}

}  // namespace
}  // namespace dsaserve::tokenizer
