// End-to-end: `dsaserve score` (the real binary) against the golden logits, and its input errors.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/fixtures.h"

namespace dsaserve {
namespace {

using testing::dsaserve_binary;
using testing::run_command;

// A minimal safetensors reader for F32 / I32 tensors (the test does not link the io module).
struct StTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<char> bytes;
};
std::map<std::string, StTensor> read_st(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f.good()) << p;
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  const std::vector<char> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::map<std::string, StTensor> out;
  const nlohmann::json j = nlohmann::json::parse(header);
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") continue;
    StTensor t;
    t.dtype = v["dtype"];
    t.shape = v["shape"].get<std::vector<int64_t>>();
    const size_t b = v["data_offsets"][0], e = v["data_offsets"][1];
    t.bytes.assign(data.begin() + std::ptrdiff_t(b), data.begin() + std::ptrdiff_t(e));
    out[name] = std::move(t);
  }
  return out;
}
template <typename T>
std::vector<T> values(const StTensor& t) {
  std::vector<T> v(t.bytes.size() / sizeof(T));
  std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}
double max_row_rel_error(const StTensor& ours, const StTensor& ref) {
  EXPECT_EQ(ours.shape, ref.shape);
  const auto a = values<float>(ours), b = values<float>(ref);
  const int64_t cols = ref.shape.at(1);
  double worst = 0;
  for (size_t r = 0; r * size_t(cols) < std::min(a.size(), b.size()); ++r) {
    double num = 0, den = 0;
    for (int64_t c = 0; c < cols; ++c) {
      num =
          std::max(num, std::fabs(double(a[r * size_t(cols) + size_t(c)]) - b[r * size_t(cols) + size_t(c)]));
      den = std::max(den, std::fabs(double(b[r * size_t(cols) + size_t(c)])));
    }
    worst = std::max(worst, num / den);
  }
  return worst;
}
std::string join(const std::vector<int32_t>& v) { return fmt::format("{}", fmt::join(v, ",")); }

TEST(ScoreCli, MatchesGoldensInChunksDecodeAndMtp) {
  DSA_FIXTURE_PATH(models, "models");
  const auto tmp = std::filesystem::temp_directory_path() / fmt::format("dsaserve_score_{}", ::getpid());
  std::filesystem::create_directories(tmp);
  struct Case {
    const char* model;
    int seq;
    const char* flags;
    bool ids_file;
  };
  for (const Case& c :
       {Case{"tiny", 3, "--chunk 7 --decode-from 20 --mtp", false},
        Case{"realdims_fp8", 2, "--chunk 16 --mtp --page-size 16", true},
        Case{"realdims", 1, "--decode-from 0 --attention absorbed", false},
        // The kernel flags reach the model's backend (on the CPU they change nothing).
        Case{"tiny", 0, "--mla-decode-kernel v5 --gemm-precision fp32 --indexer-select-path coop", false}}) {
    const auto gold = read_st(models / c.model / "goldens.safetensors");
    const auto ids = values<int32_t>(gold.at(fmt::format("seq{}.input_ids", c.seq)));
    std::string ids_arg = "--ids " + join(ids);
    if (c.ids_file) {
      const auto f = tmp / "ids.json";
      std::ofstream(f) << "[" << join(ids) << "]\n";
      ids_arg = "--ids-file " + f.string();
    }
    const auto out_path = tmp / fmt::format("{}.safetensors", c.model);
    std::string out;
    ASSERT_EQ(run_command(fmt::format("{} score --model {} {} --out {} {}", dsaserve_binary().string(),
                                      (models / c.model).string(), ids_arg, out_path.string(), c.flags),
                          &out),
              0)
        << out;
    const auto got = read_st(out_path);
    const double e = max_row_rel_error(got.at("logits"), gold.at(fmt::format("seq{}.logits", c.seq)));
    EXPECT_LE(e, 1e-4) << c.model;
    EXPECT_EQ(values<int32_t>(got.at("input_ids")), ids);
    double em = 0;
    if (std::string(c.flags).find("--mtp") != std::string::npos) {
      em = max_row_rel_error(got.at("mtp_logits"), gold.at(fmt::format("seq{}.mtp_logits", c.seq)));
      EXPECT_LE(em, 1e-4) << c.model << " MTP";
    } else {
      EXPECT_EQ(got.count("mtp_logits"), 0u);
    }
    fmt::print("[score cli] {} seq{} {}: max rel err logits {:.3g}, mtp {:.3g}\n", c.model, c.seq, c.flags, e,
               em);
  }
  std::filesystem::remove_all(tmp);
}

TEST(ScoreCli, RejectsBadInput) {
  DSA_FIXTURE_PATH(tiny, "models/tiny");
  const std::string bin = dsaserve_binary().string(), out = "/dev/null";
  auto run = [&](const std::string& args, std::string* msg) {
    return run_command(fmt::format("{} score --model {} --out {} {}", bin, tiny.string(), out, args), msg);
  };
  std::string msg;
  EXPECT_NE(run("--ids 1,2,512", &msg), 0);
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
  EXPECT_NE(run("--ids 1,-4", &msg), 0);
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
  EXPECT_NE(run("--ids ,", &msg), 0);
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;
  EXPECT_NE(run("--ids 1,x", &msg), 0);
  EXPECT_NE(msg.find("not a token id"), std::string::npos) << msg;
  EXPECT_NE(run("--ids 1,2 --page-size 0", &msg), 0);
  EXPECT_NE(run("--ids-file /nonexistent/ids.txt", &msg), 0);
  EXPECT_NE(msg.find("cannot read"), std::string::npos) << msg;
  // Kernel flags: a removed kernel or an unknown name is an error naming the flag and the accepted values.
  EXPECT_NE(run("--ids 1,2 --indexer-score-kernel v1", &msg), 0);
  EXPECT_NE(msg.find("--indexer-score-kernel: unknown value 'v1' (accepted: auto, v2, v3)"),
            std::string::npos)
      << msg;
  EXPECT_NE(run("--ids 1,2 --mla-decode-kernel v3", &msg), 0);
  EXPECT_NE(msg.find("--mla-decode-kernel"), std::string::npos) << msg;
  EXPECT_NE(run("--ids 1,2 --gemm-precision tf32", &msg), 0);
  EXPECT_NE(msg.find("accepted: fast, fp32"), std::string::npos) << msg;
  EXPECT_NE(run("--ids 1,2 --moe-fp8-tile-rows 48", &msg), 0);
  EXPECT_NE(msg.find("--moe-fp8-tile-rows 48: expected 0 (by the shapes), 8 (mma.sync) or 128 (wgmma)"),
            std::string::npos)
      << msg;
  EXPECT_NE(run("--ids 1,2 --gemm-fp8-small-max-tokens 33", &msg), 0);
  EXPECT_NE(msg.find("--gemm-fp8-small-max-tokens: the FP8 small-T GEMM takes 0..32 tokens, got 33"),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace dsaserve
