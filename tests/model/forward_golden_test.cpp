// The CPU forward against the reference fixtures (FIXTURES.md): every logits row of every sequence
// within 1e-4 relative error, computed as one prefill, in chunks of 1, 3 and 16, as half a prefill
// then token-by-token decode, and with every sequence of the file in one mixed batch; MTP logits too;
// greedy continuations exactly. Prints the measured worst error per file and mode.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/fixtures.h"
#include "golden_util.h"
#include "model/score.h"

namespace dsaserve::model {
namespace {

constexpr double kTol = 1e-4;

struct Golden {
  std::shared_ptr<Model> model;
  io::Checkpoint gold;
  nlohmann::json meta;
  int nseq = 0;
  std::vector<int32_t> ids(int i) const {
    return testing::ids_of(gold.get(fmt::format("seq{}.input_ids", i)));
  }
  Tensor logits(int i) const { return gold.get(fmt::format("seq{}.logits", i)); }
  Tensor mtp(int i) const { return gold.get(fmt::format("seq{}.mtp_logits", i)); }
};

const Golden& golden(const std::filesystem::path& dir) {
  static std::map<std::string, Golden> cache;
  auto it = cache.find(dir.string());
  if (it != cache.end()) return it->second;
  Golden g{Model::load(dir), io::Checkpoint::open(dir / "goldens.safetensors"), {}, 0};
  std::ifstream f(dir / "goldens.json");
  g.meta = nlohmann::json::parse(f);
  g.nseq = int(g.meta["sequences"].size());
  return cache.emplace(dir.string(), std::move(g)).first->second;
}

class Golden_ : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = dsaserve::testing::fixtures_dir() / "models" / GetParam();
    if (!std::filesystem::exists(dir_))
      GTEST_SKIP() << "fixture " << dir_ << " missing: set DSASERVE_FIXTURES to the shared fixtures folder";
    g_ = &golden(dir_);
  }
  // Scores every sequence with `opt`; checks and prints the worst logits (and MTP) error.
  void check_all(const std::string& mode, ScoreOptions opt) {
    double worst = 0, worst_mtp = 0;
    for (int i = 0; i < g_->nseq; ++i) {
      const auto ids = g_->ids(i);
      const ScoreResult r = score_sequence(*g_->model, ids, opt);
      const double e = testing::max_row_rel_error(r.logits, g_->logits(i));
      EXPECT_LE(e, kTol) << GetParam() << " " << mode << " seq" << i;
      worst = std::max(worst, e);
      if (opt.mtp && ids.size() >= 2) {
        const double em = testing::max_row_rel_error(r.mtp_logits, g_->mtp(i));
        EXPECT_LE(em, kTol) << GetParam() << " " << mode << " seq" << i << " MTP";
        worst_mtp = std::max(worst_mtp, em);
      }
    }
    fmt::print(
        "[golden] {:<13} {:<22} max rel err logits {:.3g}{}  (index top-k margin {:.3g}, route margin "
        "{:.3g})\n",
        GetParam(), mode, worst, opt.mtp ? fmt::format(", mtp {:.3g}", worst_mtp) : std::string(),
        g_->meta.value("index_topk_margin_min", 0.0), g_->meta.value("expert_route_margin_min", 0.0));
  }
  std::filesystem::path dir_;
  const Golden* g_ = nullptr;
};

TEST_P(Golden_, OnePrefillWithMtp) {
  ScoreOptions o;
  o.mtp = true;
  check_all("one prefill", o);
}

TEST_P(Golden_, BothAttentionFormsAgree) {
  ScoreOptions o;
  o.attention = AttentionForm::mha;
  check_all("prefill, MHA form", o);
  o.attention = AttentionForm::absorbed;
  check_all("prefill, absorbed form", o);
}

TEST_P(Golden_, Chunks) {
  for (int64_t chunk : {1, 3, 16}) {
    ScoreOptions o;
    o.chunk = chunk;
    o.mtp = chunk == 3;
    o.page_size = chunk == 1 ? 64 : 16;
    check_all(fmt::format("chunks of {}", chunk), o);
  }
}

TEST_P(Golden_, HalfPrefillThenDecodeWithMtp) {
  for (int i = 0; i < g_->nseq; ++i) {
    const auto ids = g_->ids(i);
    ScoreOptions o;
    o.decode_from = int64_t(ids.size()) / 2;
    o.mtp = true;
    const ScoreResult r = score_sequence(*g_->model, ids, o);
    EXPECT_LE(testing::max_row_rel_error(r.logits, g_->logits(i)), kTol) << "seq" << i;
    if (ids.size() >= 2) {
      EXPECT_LE(testing::max_row_rel_error(r.mtp_logits, g_->mtp(i)), kTol) << "seq" << i << " MTP";
    }
  }
  ScoreOptions o;
  o.decode_from = 0;  // prints the worst error of the decode path (prefill of 1 token, then decode)
  o.mtp = true;
  check_all("1 token then decode", o);
}

// Every sequence of the file in one batch stream: staggered starts, different prefill chunk sizes, then
// decode, so steps mix prefill chunks and decodes of requests at different positions. Pages (size 16)
// are handed out on demand from one cache, so requests' pages interleave. MTP runs in the same steps.
TEST_P(Golden_, MixedBatchesWithMtp) {
  const Model& m = *g_->model;
  const int64_t V = m.config().vocab_size, H = m.config().hidden_size, ps = 16;
  struct Req {
    std::vector<int32_t> ids;
    int64_t cached = 0, prefill_end = 0, chunk = 0, join = 0;
    std::vector<int32_t> pages;
    Tensor logits, mtp;
  };
  std::vector<Req> reqs;
  int64_t pages_needed = 0;
  const int64_t chunks[] = {5, 16, 3, 64, 7};
  for (int i = 0; i < g_->nseq; ++i) {
    Req r;
    r.ids = g_->ids(i);
    const int64_t n = int64_t(r.ids.size());
    r.prefill_end = std::max<int64_t>(1, n / 2);
    r.chunk = chunks[i % 5];
    r.join = i;
    r.logits = Tensor::zeros({n, V}, DType::f32);
    r.mtp = Tensor::zeros({std::max<int64_t>(n - 1, 1), V}, DType::f32);
    pages_needed += (n + ps - 1) / ps;
    reqs.push_back(std::move(r));
  }
  KvCache cache = m.make_cache(pages_needed, ps);
  int32_t next_page = 0;
  auto reserve = [&](std::vector<int32_t>& pages, int64_t tokens) {
    while (int64_t(pages.size()) * ps < tokens) pages.push_back(next_page++);
  };
  ForwardOptions fo;
  fo.keep_hidden = true;
  int64_t mixed_steps = 0;
  for (int64_t step = 0;; ++step) {
    ForwardBatch batch, mtp_batch;
    batch.page_size = mtp_batch.page_size = ps;
    std::vector<size_t> in_batch;
    bool any_prefill = false, any_decode = false;
    for (size_t i = 0; i < reqs.size(); ++i) {
      Req& r = reqs[i];
      const int64_t n = int64_t(r.ids.size());
      if (step < r.join || r.cached >= n) continue;
      const int64_t take = r.cached < r.prefill_end ? std::min(r.chunk, r.prefill_end - r.cached) : 1;
      (r.cached < r.prefill_end ? any_prefill : any_decode) = true;
      reserve(r.pages, r.cached + take);
      batch.add_request(std::span<const int32_t>(r.ids).subspan(size_t(r.cached), size_t(take)), r.cached,
                        r.pages);
      in_batch.push_back(i);
    }
    if (in_batch.empty()) break;
    mixed_steps += (any_prefill && any_decode) ? 1 : 0;
    const ForwardOutput out = m.forward(batch, cache, fo);
    std::vector<std::pair<size_t, int64_t>> mtp_rows;  // (request, first main-batch row)
    for (size_t k = 0; k < in_batch.size(); ++k) {
      Req& r = reqs[in_batch[k]];
      const int64_t b = batch.token_begin[k], e = batch.token_begin[k + 1], take = e - b;
      std::memcpy(r.logits.data<float>() + r.cached * V, out.logits.data<float>() + b * V,
                  size_t(take * V) * 4);
      // MTP for positions cached .. cached+take-1 whose next token exists.
      const int64_t last = std::min<int64_t>(r.cached + take, int64_t(r.ids.size()) - 1);
      if (last > r.cached) {
        mtp_batch.add_request(
            std::span<const int32_t>(r.ids).subspan(size_t(r.cached + 1), size_t(last - r.cached)), r.cached,
            r.pages);
        mtp_rows.emplace_back(in_batch[k], b);
      }
      r.cached += take;
    }
    if (!mtp_rows.empty()) {
      Tensor hid = Tensor::empty({mtp_batch.num_tokens(), H}, DType::f32);
      for (size_t k = 0; k < mtp_rows.size(); ++k) {
        const int64_t cnt = mtp_batch.num_new(int64_t(k));
        std::memcpy(hid.data<float>() + mtp_batch.token_begin[k] * H,
                    out.hidden.data<float>() + mtp_rows[k].second * H, size_t(cnt * H) * 4);
      }
      const ForwardOutput mo = m.forward_mtp(mtp_batch, hid, cache, fo);
      for (size_t k = 0; k < mtp_rows.size(); ++k) {
        Req& r = reqs[mtp_rows[k].first];
        const int64_t cnt = mtp_batch.num_new(int64_t(k)), p0 = mtp_batch.start_pos[k];
        std::memcpy(r.mtp.data<float>() + p0 * V, mo.logits.data<float>() + mtp_batch.token_begin[k] * V,
                    size_t(cnt * V) * 4);
      }
    }
  }
  EXPECT_GT(mixed_steps, 0) << "no step mixed prefill chunks with decodes";
  double worst = 0, worst_mtp = 0;
  for (int i = 0; i < g_->nseq; ++i) {
    const double e = testing::max_row_rel_error(reqs[size_t(i)].logits, g_->logits(i));
    EXPECT_LE(e, kTol) << "seq" << i;
    worst = std::max(worst, e);
    if (reqs[size_t(i)].ids.size() >= 2) {
      const double em = testing::max_row_rel_error(reqs[size_t(i)].mtp, g_->mtp(i));
      EXPECT_LE(em, kTol) << "seq" << i << " MTP";
      worst_mtp = std::max(worst_mtp, em);
    }
  }
  EXPECT_EQ(next_page, pages_needed);
  fmt::print("[golden] {:<13} {:<22} max rel err logits {:.3g}, mtp {:.3g} ({} mixed steps)\n", GetParam(),
             "mixed batches", worst, worst_mtp, mixed_steps);
}

TEST_P(Golden_, GreedyExact) {
  for (const auto& gm : g_->meta["greedy"]) {
    const int j = gm["index"].get<int>();
    const auto prompt = testing::ids_of(g_->gold.get(fmt::format("greedy{}.prompt", j)));
    const auto expect = testing::ids_of(g_->gold.get(fmt::format("greedy{}.output", j)));
    const auto got = greedy_generate(*g_->model, prompt, int64_t(expect.size()));
    EXPECT_EQ(got, expect) << GetParam() << " greedy" << j << " (argmax margin "
                           << gm.value("argmax_margin", 0.0) << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, Golden_, ::testing::Values("tiny", "realdims", "realdims_fp8"));

}  // namespace
}  // namespace dsaserve::model
