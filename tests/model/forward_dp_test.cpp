// Attention DP through Model::forward itself, ranks as threads of this process over Gloo (real TCP on
// 127.0.0.1): each DP group runs its own batch (different requests and lengths), without
// ForwardOptions::dp_tokens (so the forward syncs the counts itself), and a group with nothing to run takes
// an idle step; every rank's logits equal one process's for its own batch.
// tests/cli/score_tp_test.cpp runs the same layouts as processes through the binary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "common/fixtures.h"
#include "model/model.h"
#include "thread_ranks.h"

namespace dsaserve::model {
namespace {

std::vector<int32_t> tokens(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t((i * 37 + salt * 11 + 5) % 500));
  return t;
}

// Two steps per DP group: step 0 prefills its requests, step 1 decodes group 0's request (group 1 idles).
// Request r's page is r.
struct Steps {
  std::vector<ForwardBatch> group0, group1;
};
Steps make_steps() {
  Steps s;
  ForwardBatch a;
  a.add_request(tokens(10, 0), 0, std::vector<int32_t>{0}, false);
  ForwardBatch d;
  d.add_request(std::vector<int32_t>{7}, 10, std::vector<int32_t>{0}, true);
  s.group0 = {a, d};
  ForwardBatch bc;
  bc.add_request(tokens(7, 1), 0, std::vector<int32_t>{1}, false);
  bc.add_request(tokens(3, 2), 0, std::vector<int32_t>{2}, false);
  s.group1 = {bc};
  return s;
}

double max_rel(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_f32_vector(), y = b.to_f32_vector();
  EXPECT_EQ(x.size(), y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    num = std::max(num, double(std::abs(x[i] - y[i])));
    den = std::max(den, double(std::abs(y[i])));
  }
  return num / std::max(den, 1e-30);
}

TEST(ForwardDp, RanksAsThreadsEqualOneProcessWithIdleSteps) {
  DSA_FIXTURE_PATH(dir, "models/tiny");
  const std::shared_ptr<Model> whole = Model::load(dir, false);
  const Steps steps = make_steps();
  // One process: each DP group's batches on their own cache.
  std::vector<std::vector<Tensor>> want(2);
  for (int g = 0; g < 2; ++g) {
    KvCache cache = whole->make_cache(3);
    for (const ForwardBatch& b : g == 0 ? steps.group0 : steps.group1)
      want[size_t(g)].push_back(whole->forward(b, cache).logits.clone());
  }
  for (const dist::ParallelLayout layout : {dist::ParallelLayout{2, 2, 2}, dist::ParallelLayout{4, 2, 2}}) {
    const int64_t n = layout.tp;
    std::vector<std::vector<Tensor>> got(static_cast<size_t>(n));
    const std::vector<std::string> errors =
        run_thread_ranks(layout, [&](const dist::ProcessGroups& groups, int64_t r) {
          const std::shared_ptr<Model> m = whole->sharded({layout, r});
          ForwardOptions fo;
          fo.dist = &groups;  // no dp_tokens: the forward all-gathers the counts
          KvCache cache = m->make_cache(3);
          const int64_t g = layout.attn_dp_rank(r);
          const std::vector<ForwardBatch>& mine = g == 0 ? steps.group0 : steps.group1;
          for (size_t i = 0; i < 2; ++i) {
            if (i < mine.size()) {
              got[size_t(r)].push_back(m->forward(mine[i], cache, fo).logits.clone());
            } else {
              m->idle_step(fo);
            }
          }
        });
    for (int64_t r = 0; r < n; ++r) {
      ASSERT_EQ(errors[size_t(r)], "") << layout.describe() << " rank " << r;
      const std::vector<Tensor>& w = want[size_t(layout.attn_dp_rank(r))];
      ASSERT_EQ(got[size_t(r)].size(), w.size()) << layout.describe() << " rank " << r;
      for (size_t i = 0; i < w.size(); ++i)
        EXPECT_LT(max_rel(got[size_t(r)][i], w[i]), 1e-5)
            << layout.describe() << " rank " << r << " step " << i;
    }
  }
}

}  // namespace
}  // namespace dsaserve::model
