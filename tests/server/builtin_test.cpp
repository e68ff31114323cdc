// The built-in model (`--model builtin:demo`) has the config's MTP layer bound, and it runs.
#include "server/builtin.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <nlohmann/json.hpp>

namespace dsaserve::server {
namespace {

TEST(Builtin, ModelIncludesItsMtpLayer) {
  const auto dir =
      std::filesystem::temp_directory_path() / fmt::format("dsaserve-builtin-test-{}", ::getpid());
  auto m = make_builtin_model(dir, 3);
  std::filesystem::remove_all(dir);
  const auto cfg = nlohmann::json::parse(builtin_config_json());
  ASSERT_GT(cfg["num_nextn_predict_layers"].get<int64_t>(), 0);
  EXPECT_EQ(m->num_mtp_layers(), cfg["num_nextn_predict_layers"].get<int64_t>());

  // One prefill, then the MTP layer over its hidden states: logits of the vocabulary, finite.
  model::KvCache cache = m->make_cache(4, 16);
  model::ForwardBatch fb;
  fb.page_size = 16;
  const std::vector<int32_t> pages = {0, 1};
  fb.add_request(std::vector<int32_t>{5, 6, 7, 8}, 0, pages);
  model::ForwardOptions opt;
  opt.keep_hidden = true;
  const model::ForwardOutput out = m->forward(fb, cache, opt);
  ASSERT_TRUE(out.hidden.defined());
  const model::ForwardOutput mtp = m->forward_mtp(fb, out.hidden, cache, opt, 0);
  const Tensor l = mtp.logits.contiguous();
  ASSERT_EQ(l.size(1), cfg["vocab_size"].get<int64_t>());
  for (int64_t i = 0; i < l.numel(); ++i) ASSERT_TRUE(std::isfinite(l.data<float>()[i]));
}

}  // namespace
}  // namespace dsaserve::server
