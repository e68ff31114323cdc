// StepPlan (model/step_plan.h): the pass kind, rows, page tables, logits rows, attention forms and the one
// upload of a step, built from its ForwardBatch; and on the CPU fixtures, the verify shape (decoding
// requests with 3 new tokens each over an existing cache) gives the logits of the same tokens run as
// prefill chunks, bit for bit, and the goldens' logits.
#include "model/step_plan.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <vector>

#include "common/fixtures.h"
#include "core/error.h"
#include "golden_util.h"
#include "io/safetensors.h"
#include "model/model.h"

namespace dsaserve::model {
namespace {

std::vector<int32_t> iota_pages(int32_t first, int32_t n) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < n; ++i) p.push_back(first + i);
  return p;
}

TEST(StepPlan, KindsFromTheRequestsState) {
  StepPlanConfig cfg;
  const std::vector<int32_t> one = {7}, three = {1, 2, 3};
  const std::vector<int32_t> pages = {0, 1};
  auto kind = [&](std::initializer_list<std::pair<int, bool>> reqs, bool mtp = false) {
    ForwardBatch b;
    b.page_size = 16;
    for (auto [n, dec] : reqs)
      b.add_request(n == 1 ? std::span<const int32_t>(one) : std::span<const int32_t>(three), 5, pages, dec);
    StepPlanConfig c = cfg;
    c.mtp = mtp;
    return StepPlan::build(b, c).kind;
  };
  EXPECT_EQ(kind({{3, false}, {1, false}}), StepKind::prefill);
  EXPECT_EQ(kind({{1, true}, {1, true}}), StepKind::decode);
  EXPECT_EQ(kind({{1, true}, {3, false}}), StepKind::mixed);
  EXPECT_EQ(kind({{3, true}, {3, true}}), StepKind::verify);
  EXPECT_EQ(kind({{3, true}, {1, true}}), StepKind::verify);
  EXPECT_EQ(kind({{1, true}}, true), StepKind::draft);
  EXPECT_EQ(kind({{3, true}}, true), StepKind::draft_extend);
  EXPECT_EQ(kind({{3, false}}, true), StepKind::draft_extend);
  EXPECT_STREQ(step_kind_name(StepKind::verify), "verify");
}

TEST(StepPlan, RowsPagesAndLogitsRows) {
  ForwardBatch b;
  b.page_size = 4;
  const std::vector<int32_t> a = {1, 2, 3, 4, 5}, d = {9}, v = {6, 7, 8};
  b.add_request(a, 0, iota_pages(10, 3), false);  // a prompt of 5: 2 used pages, 1 reserved ahead
  b.add_request(d, 6, iota_pages(20, 2), true);   // a decode at position 6
  b.add_request(v, 2, iota_pages(30, 2), true);   // a verify of 3 at positions 2..4
  b.extra_logit_rows = {1};
  b.validate(100, 64);
  StepPlanConfig cfg;
  cfg.all_logits = false;
  cfg.dims.topk = 4;
  cfg.dims.heads = 2;
  const StepPlan p = StepPlan::build(b, cfg);
  EXPECT_EQ(p.kind, StepKind::mixed);
  EXPECT_EQ(p.num_tokens(), 9);
  EXPECT_EQ(p.max_len, 7);
  EXPECT_TRUE(p.runs_indexer);
  EXPECT_EQ(p.row_seq, (std::vector<int32_t>{0, 0, 0, 0, 0, 1, 2, 2, 2}));
  EXPECT_EQ(p.row_len, (std::vector<int32_t>{1, 2, 3, 4, 5, 7, 3, 4, 5}));
  EXPECT_EQ(p.used_pages, (std::vector<int64_t>{2, 2, 2}));
  // Used pages, then the last used page: [3, 2].
  EXPECT_EQ(p.page_table, (std::vector<int32_t>{10, 11, 20, 21, 30, 31}));
  // Logits: the prompt's last token, the decode's, every verify row, then the extra row.
  EXPECT_EQ(p.logit_rows, (std::vector<int32_t>{4, 5, 6, 7, 8, 1}));
  EXPECT_EQ(p.num_logit_rows(), 6);
  EXPECT_TRUE(p.all_absorbed());  // every request below mha_min_tokens
  EXPECT_TRUE(p.absorbed_rows.empty());
  const StepLayout& L = p.layout;
  EXPECT_EQ(L.size(), 5 * 9 + 3 * 2 + 6);
  std::vector<int32_t> buf(size_t(L.size()), -1);
  p.pack(buf);
  EXPECT_EQ(buf[size_t(L.ids() + 5)], 9);
  EXPECT_EQ(buf[size_t(L.positions() + 5)], 6);
  EXPECT_EQ(buf[size_t(L.slots() + 5)], 21 * 4 + 2);
  EXPECT_EQ(buf[size_t(L.row_len() + 8)], 5);
  EXPECT_EQ(buf[size_t(L.page_table() + 5)], 31);
  EXPECT_EQ(buf[size_t(L.logit_rows_at() + 5)], 1);
  EXPECT_THROW(p.pack(std::span<int32_t>(buf.data(), 4)), Error);
  // On the CPU the upload is the packed buffer itself, bound as views.
  const StepInputs in = p.upload(Device::cpu);
  EXPECT_EQ(in.page_table.size(0), 3);
  EXPECT_EQ(in.page_table.size(1), 2);
  ASSERT_EQ(in.page_tables.size(), 3u);
  EXPECT_EQ(in.page_tables[2].size(0), 2);
  EXPECT_EQ(in.logit_rows.size(0), 6);
  EXPECT_FALSE(in.absorbed_rows.defined());
  // all_logits: every row, none gathered; a decode step's one row per request: none gathered either.
  cfg.all_logits = true;
  EXPECT_TRUE(StepPlan::build(b, cfg).logit_rows.empty());
  ForwardBatch dec;
  dec.page_size = 4;
  dec.add_request(d, 6, iota_pages(20, 2), true);
  dec.add_request(d, 3, iota_pages(40, 1), true);
  cfg.all_logits = false;
  const StepPlan dp = StepPlan::build(dec, cfg);
  EXPECT_EQ(dp.kind, StepKind::decode);
  EXPECT_TRUE(dp.logit_rows.empty());
  EXPECT_EQ(dp.layout.size(), 5 * 2 + 2 * 2);  // a decode graph's static inputs
  // A capacity (CUDA graphs): the kernels' bound and the page-table width are the capacity's.
  cfg.capacity = StepCapacity{16, 4};
  const StepPlan cp = StepPlan::build(dec, cfg);
  EXPECT_EQ(cp.max_len, 16);
  EXPECT_EQ(cp.layout.pages, 4);
  EXPECT_EQ(cp.page_table, (std::vector<int32_t>{20, 21, 21, 21, 40, 40, 40, 40}));
  cfg.capacity = StepCapacity{6, 2};  // below the longest request (7)
  EXPECT_THROW(StepPlan::build(dec, cfg), Error);
}

TEST(StepPlan, AttentionFormPerRequest) {
  ForwardBatch b;
  b.page_size = 4;
  const std::vector<int32_t> lng = {1, 2, 3, 4, 5, 6}, shrt = {7};
  b.add_request(shrt, 3, iota_pages(0, 1), true);
  b.add_request(lng, 0, iota_pages(4, 2), false);
  b.add_request(shrt, 2, iota_pages(8, 1), true);
  StepPlanConfig cfg;
  cfg.dims.heads = 4;
  cfg.mha_min_tokens = 4;  // the 6-token prompt takes MHA (no rates measured at these dims: MHA)
  cfg.form_rule.wide = AttentionFormRates{};
  cfg.form_rule.narrow = AttentionFormRates{};
  const StepPlan p = StepPlan::build(b, cfg);
  EXPECT_EQ(p.mha, (std::vector<uint8_t>{0, 1, 0}));
  EXPECT_EQ(p.absorbed, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(p.absorbed_rows, (std::vector<int32_t>{0, 7}));
  EXPECT_EQ(p.layout.absorbed_rows, 2);
  cfg.attention = AttentionForm::absorbed;
  EXPECT_TRUE(StepPlan::build(b, cfg).all_absorbed());
  cfg.attention = AttentionForm::mha;
  EXPECT_TRUE(StepPlan::build(b, cfg).absorbed.empty());
}

// The fixtures' sequences of at least 8 tokens, each with all but its last 6 tokens cached, then two
// steps of 3 new tokens per request: as verify steps (decoding, logits at every row) and as prefill chunks
// (all logits). Both must give the same logits bit for bit, and the goldens' within 1e-4.
class VerifyShape : public ::testing::TestWithParam<const char*> {};

TEST_P(VerifyShape, ThreeNewTokensPerDecodingRequestEqualPrefillChunks) {
  const auto dir = dsaserve::testing::fixtures_dir() / "models" / GetParam();
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "fixture " << dir << " missing";
  const auto m = Model::load(dir, false);
  const io::Checkpoint gold = io::Checkpoint::open(dir / "goldens.safetensors");
  const int64_t ps = 16, V = m->config().vocab_size;
  struct Req {
    std::vector<int32_t> ids, pages;
    Tensor logits;  // the goldens'
  };
  std::vector<Req> reqs;
  int32_t next_page = 0;
  for (int i = 0;; ++i) {
    const std::string key = fmt::format("seq{}.input_ids", i);
    if (!gold.contains(key)) break;
    Req r;
    r.ids = testing::ids_of(gold.get(key));
    if (r.ids.size() < 8) continue;
    const int32_t n_pages = int32_t((r.ids.size() + ps - 1) / ps);
    r.pages = iota_pages(next_page, n_pages);
    next_page += n_pages;
    r.logits = gold.get(fmt::format("seq{}.logits", i));
    reqs.push_back(std::move(r));
  }
  ASSERT_GE(reqs.size(), 2u);
  // Two caches in the same state: the prefixes as one prefill batch.
  KvCache verify_cache = m->make_cache(next_page, ps), chunk_cache = m->make_cache(next_page, ps);
  {
    ForwardBatch pre;
    pre.page_size = ps;
    for (const Req& r : reqs)
      pre.add_request(std::span<const int32_t>(r.ids).first(r.ids.size() - 6), 0, r.pages, false);
    ForwardOptions o;
    o.all_logits = false;
    (void)m->forward(pre, verify_cache, o);
    (void)m->forward(pre, chunk_cache, o);
  }
  double worst = 0;
  for (int64_t step = 0; step < 2; ++step) {
    ForwardBatch vb, cb;
    vb.page_size = cb.page_size = ps;
    for (const Req& r : reqs) {
      const int64_t start = int64_t(r.ids.size()) - 6 + 3 * step;
      const auto toks = std::span<const int32_t>(r.ids).subspan(size_t(start), 3);
      vb.add_request(toks, start, r.pages, true);
      cb.add_request(toks, start, r.pages, false);
    }
    ForwardOptions vo;
    vo.all_logits = false;  // the engine's options: the plan returns every verify row
    const StepPlan plan = m->plan_step(vb, vo);
    EXPECT_EQ(plan.kind, StepKind::verify);
    EXPECT_STREQ(plan.trace_pass(), "verify");
    EXPECT_EQ(plan.num_logit_rows(), 3 * int64_t(reqs.size()));
    vo.plan = &plan;
    const Tensor v = m->forward(vb, verify_cache, vo).logits;
    const Tensor c = m->forward(cb, chunk_cache, ForwardOptions{}).logits;
    ASSERT_EQ(v.size(0), 3 * int64_t(reqs.size()));
    ASSERT_EQ(c.size(0), v.size(0));
    const std::vector<float> vv = v.to_f32_vector(), cv = c.to_f32_vector();
    for (size_t i = 0; i < vv.size(); ++i)
      ASSERT_EQ(vv[i], cv[i]) << GetParam() << " step " << step << " row " << int64_t(i) / V;
    for (size_t q = 0; q < reqs.size(); ++q) {
      const int64_t start = int64_t(reqs[q].ids.size()) - 6 + 3 * step;
      const double e = testing::max_row_rel_error(v.slice(0, int64_t(q) * 3, int64_t(q) * 3 + 3).contiguous(),
                                                  reqs[q].logits.slice(0, start, start + 3).contiguous());
      EXPECT_LE(e, 1e-4) << GetParam() << " request " << q << " step " << step;
      worst = std::max(worst, e);
    }
  }
  fmt::print("[verify shape] {:<13} {} requests x 3 new tokens, 2 steps: max rel err {:.3g}\n", GetParam(),
             reqs.size(), worst);
}

// A mixed step where some requests take the MHA form and the absorbed ones attend per request over their
// rows of the step (the plan's row arrays): the same logits as the all-absorbed step, within 1e-4.
TEST_P(VerifyShape, MixedFormsMatchTheAbsorbedForm) {
  const auto dir = dsaserve::testing::fixtures_dir() / "models" / GetParam();
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "fixture " << dir << " missing";
  const auto m = Model::load(dir, false);
  const int64_t ps = 16, V = m->config().vocab_size;
  const std::vector<int64_t> cached = {20, 3, 40};
  const std::vector<int64_t> fresh = {1, 12, 2};  // a decode, a 12-token chunk, a 2-token chunk
  auto batch = [&](bool pre, const std::vector<std::vector<int32_t>>& pages) {
    ForwardBatch b;
    b.page_size = ps;
    for (size_t r = 0; r < cached.size(); ++r) {
      std::vector<int32_t> ids;
      const int64_t from = pre ? 0 : cached[r], n = pre ? cached[r] : fresh[r];
      for (int64_t p = from; p < from + n; ++p) ids.push_back(int32_t((int64_t(r) * 37 + p * 11 + 3) % V));
      b.add_request(ids, from, pages[r], pre ? false : fresh[r] == 1);
    }
    return b;
  };
  std::vector<std::vector<int32_t>> pages;
  int32_t next = 0;
  for (size_t r = 0; r < cached.size(); ++r) {
    pages.push_back(iota_pages(next, 4));
    next += 4;
  }
  Tensor out[2];
  for (int form = 0; form < 2; ++form) {
    KvCache cache = m->make_cache(next, ps);
    (void)m->forward(batch(true, pages), cache, ForwardOptions{});
    ForwardOptions o;
    o.all_logits = false;
    o.mha_min_tokens = form == 0 ? 4 : 256;  // form 0: the 12-token chunk takes MHA, the others absorbed
    o.form_rule.wide = o.form_rule.narrow = AttentionFormRates{};  // unmeasured rates: MHA from there
    const ForwardBatch b = batch(false, pages);
    const StepPlan plan = m->plan_step(b, o);
    EXPECT_EQ(plan.absorbed.size(), form == 0 ? 2u : 3u);
    out[form] = m->forward(b, cache, o).logits;
  }
  ASSERT_EQ(out[0].size(0), 3);
  EXPECT_LE(testing::max_row_rel_error(out[0], out[1]), 1e-4) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Cpu, VerifyShape, ::testing::Values("tiny", "realdims"));

}  // namespace
}  // namespace dsaserve::model
