// The speculative round's CUDA graphs (runtime/engine/cuda_graph_spec.h, issue 17) on the GPU, realdims:
// verify passes (steps + 1 rows per request, every row's logits and hidden state) and the MTP layer's
// draft steps replayed through captured graphs against the eager forward (bf16 and FP8 latent caches;
// batches of 1 and 3 requests, the 3 padded to the bucket of 4; contexts crossing index_topk, so a context
// bucket is captured lazily mid-run), then the engine's greedy output with speculation and graphs against
// plain greedy decoding. Prints "RESULT spec_graph ..." lines.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <vector>

#include "common/fixtures.h"
#include "gpu_test.h"
#include "graph_requests.h"
#include "model/model.h"
#include "runtime/engine/cuda_graph_spec.h"
#include "runtime/engine/device.h"
#include "runtime/engine/engine.h"

namespace dsaserve {
namespace {

using model::ForwardBatch;
using model::KvCache;
using model::KvCacheDtype;
using model::Model;

constexpr int64_t kPs = 64, kPagesPerReq = 3;  // up to 192 tokens per request

std::shared_ptr<Model> realdims_mtp(const std::filesystem::path& dir) {
  return runtime::model_on_device(Model::load(dir, true), Device::cuda);
}

// Prefills each request's lens[r] tokens (target KV) and, when `mtp`, the MTP layer's KV over them (its
// row p takes token p + 1 and the target's hidden state at p, as the engine's mtp_after_step does).
// Returns each request's last hidden row [1, H] (the first draft step's input).
std::vector<Tensor> prefill(const Model& m, KvCache& cache, const std::vector<int64_t>& lens,
                            const std::vector<std::vector<int32_t>>& tables, bool mtp) {
  std::vector<Tensor> last;
  for (size_t r = 0; r < lens.size(); ++r) {
    std::vector<int32_t> ids;
    for (int64_t p = 0; p < lens[r]; ++p)
      ids.push_back(testing::graph_token(int64_t(r), p, m.config().vocab_size));
    ForwardBatch b;
    b.page_size = kPs;
    b.add_request(ids, 0, tables[r], false);
    model::ForwardOptions fo;
    fo.all_logits = false;
    fo.keep_hidden = true;
    const model::ForwardOutput o = m.forward(b, cache, fo);
    last.push_back(o.hidden.slice(0, lens[r] - 1, lens[r]));
    if (mtp && lens[r] > 1) {
      ForwardBatch mb;
      mb.page_size = kPs;
      mb.add_request(std::span<const int32_t>(ids).subspan(1), 0, tables[r], false);
      model::ForwardOptions mo;
      mo.all_logits = false;
      (void)m.forward_mtp(mb, o.hidden.slice(0, 0, lens[r] - 1), cache, mo, 0);
    }
  }
  return last;
}

Tensor stack(const std::vector<Tensor>& rows) {
  const int64_t H = rows[0].size(1);
  Tensor out = Tensor::empty({int64_t(rows.size()), H}, DType::f32, Device::cuda);
  for (size_t i = 0; i < rows.size(); ++i) {
    Tensor dst = out.slice(0, int64_t(i), int64_t(i) + 1);
    kernels::copy_rows(dst, rows[i]);
  }
  return out;
}

int64_t argmax_row(const float* p, int64_t n) { return int64_t(std::max_element(p, p + n) - p); }

const char* kv_name(KvCacheDtype kv) { return kv == KvCacheDtype::bf16 ? "bf16" : "fp8"; }

// Graph rows against eager rows (both [rows, n] f32 on the device): per row the max abs difference over
// the eager row's max abs value, collected into `rel`; argmax agreement counted when `argmax`.
struct Diff {
  std::vector<double> rel;
  double worst_abs = 0;
  int64_t agree = 0, rows = 0;
  void add(const Tensor& eager_d, const Tensor& graph_d, bool argmax) {
    const Tensor eager = eager_d.to(Device::cpu), graph = graph_d.to(Device::cpu);
    ASSERT_GE(graph.size(0), eager.size(0));
    ASSERT_EQ(graph.size(1), eager.size(1));
    const int64_t n = eager.size(1);
    const float* pe = eager.data<float>();
    const float* pg = graph.data<float>();
    for (int64_t r = 0; r < eager.size(0); ++r) {
      double num = 0, den = 0;
      for (int64_t c = 0; c < n; ++c) {
        const double x = pg[r * n + c], y = pe[r * n + c];
        num = std::max(num, std::isfinite(x) ? std::fabs(x - y) : INFINITY);
        den = std::max(den, std::fabs(y));
      }
      worst_abs = std::max(worst_abs, num);
      rel.push_back(den > 0 ? num / den : num);
      if (argmax) {
        agree += argmax_row(pg + r * n, n) == argmax_row(pe + r * n, n);
        ++rows;
      }
    }
  }
  double max_rel() {
    std::sort(rel.begin(), rel.end());
    return rel.empty() ? 0 : rel.back();
  }
  double median_rel() {
    std::sort(rel.begin(), rel.end());
    return rel.empty() ? 0 : rel[rel.size() / 2];
  }
};

// Batch 1 runs the eager step's rows and shapes; padded batches change the GEMMs' row counts (and so
// possibly cuBLASLt's algorithm): rounding-level differences, which a near-tied top-k choice can amplify.
void expect_close(Diff& logits, Diff& hidden, int64_t B, KvCacheDtype kv) {
  if (B == 1) {
    EXPECT_LE(logits.max_rel(), 1e-5);
    EXPECT_LE(hidden.max_rel(), 1e-5);
    EXPECT_EQ(logits.agree, logits.rows);
  } else {
    EXPECT_LE(logits.median_rel(), kv == KvCacheDtype::bf16 ? 1e-2 : 5e-2);
    EXPECT_LE(hidden.median_rel(), kv == KvCacheDtype::bf16 ? 1e-2 : 5e-2);
    EXPECT_GE(double(logits.agree), 0.85 * double(logits.rows));
  }
}

const std::vector<std::vector<int64_t>> kStarts = {
    {27},         // B=1: context 32 -> 64 during the run (a lazily captured bucket)
    {4, 30, 69},  // B=3, padded to 4
};

TEST(CudaSpecGraph, RealdimsVerifyReplayEqualsEager) {
  DSA_SKIP_WITHOUT_GPU();
  DSA_FIXTURE_PATH(dir, "models/realdims");
  const std::shared_ptr<Model> m = realdims_mtp(dir);
  ASSERT_EQ(m->config().index_topk, 32) << "the cases straddle realdims' index_topk of 32";
  const int64_t V = m->config().vocab_size, steps = 3, K = steps + 1;
  constexpr int kRounds = 4;
  for (KvCacheDtype kv : {KvCacheDtype::bf16, KvCacheDtype::fp8_e4m3}) {
    for (const std::vector<int64_t>& start : kStarts) {
      const int64_t B = int64_t(start.size());
      SCOPED_TRACE(fmt::format("kv {} B {}", kv_name(kv), B));
      const auto tables = testing::interleaved_page_tables(B, kPagesPerReq);
      const int64_t pages = B * kPagesPerReq + 1;
      KvCache ce = KvCache::create(m->config(), pages, kPs, true, Device::cuda, kv);
      KvCache cg = KvCache::create(m->config(), pages, kPs, true, Device::cuda, kv);
      std::vector<int64_t> lens(start.size());
      for (size_t r = 0; r < start.size(); ++r) lens[r] = start[r] + 1;
      (void)prefill(*m, ce, lens, tables, false);
      (void)prefill(*m, cg, lens, tables, false);
      model::ForwardOptions fo;
      fo.all_logits = false;
      runtime::SpecGraphRunner graphs(*m, cg, int32_t(B * kPagesPerReq), 8, fo, steps);
      const double cap_s = graphs.capture_all();
      ASSERT_FALSE(graphs.verify_stats().disabled) << "a start-up capture failed (its warning is above)";
      const int64_t graphs0 = graphs.verify_stats().graphs;
      EXPECT_EQ(graphs0, 4) << "buckets 1, 2, 4, 8 at context 32";
      Diff logits, hidden;
      std::vector<int64_t> cached = lens;
      for (int s = 0; s < kRounds; ++s) {
        // As draft_and_verify builds it: K rows per request (pending + drafts) after its cached tokens.
        ForwardBatch vb;
        vb.page_size = kPs;
        for (int64_t r = 0; r < B; ++r) {
          std::vector<int32_t> ids;
          for (int64_t j = 0; j < K; ++j)
            ids.push_back(testing::graph_token(r + 5, cached[size_t(r)] + j, V));
          vb.add_request(ids, cached[size_t(r)], tables[size_t(r)], false);
        }
        model::ForwardOptions vo;
        vo.all_logits = true;
        vo.keep_hidden = true;
        const model::ForwardOutput e = m->forward(vb, ce, vo);
        std::optional<model::ForwardOutput> g = graphs.verify(vb);
        ASSERT_TRUE(g.has_value()) << "round " << s << " did not replay (a capture failed?)";
        ASSERT_EQ(g->logits.size(0), B * K);
        ASSERT_EQ(g->hidden.size(0), B * K);
        logits.add(e.logits, g->logits, true);
        hidden.add(e.hidden, g->hidden, false);
        for (int64_t& c : cached) c += K;  // every draft accepted: the next round's rows follow
      }
      const runtime::CudaGraphStats st = graphs.verify_stats();
      fmt::print(
          "RESULT spec_graph realdims verify kv={} B={} rows/request={} rounds={} logits max_abs={:.3g} "
          "max_rel={:.3g} median_rel={:.3g} hidden max_rel={:.3g} argmax_agree={}/{} graphs={} (start-up {} "
          "in {:.1f} ms) replays={}\n",
          kv_name(kv), B, K, kRounds, logits.worst_abs, logits.max_rel(), logits.median_rel(),
          hidden.max_rel(), logits.agree, logits.rows, st.graphs, graphs0, cap_s * 1e3, st.replays);
      EXPECT_EQ(st.replays, kRounds);
      EXPECT_GT(st.graphs, graphs0) << "a longer context bucket should have been captured lazily";
      expect_close(logits, hidden, B, kv);
      // A batch whose requests have other row counts than steps + 1 is declined (eager).
      ForwardBatch ragged;
      ragged.page_size = kPs;
      const std::vector<int32_t> two{1, 2};
      ragged.add_request(two, cached[0], tables[0], false);
      EXPECT_FALSE(graphs.verify(ragged).has_value());
    }
  }
}

TEST(CudaSpecGraph, RealdimsDraftReplayEqualsEager) {
  DSA_SKIP_WITHOUT_GPU();
  DSA_FIXTURE_PATH(dir, "models/realdims");
  const std::shared_ptr<Model> m = realdims_mtp(dir);
  ASSERT_GT(m->num_mtp_layers(), 0);
  const int64_t V = m->config().vocab_size;
  constexpr int kSteps = 6;
  for (KvCacheDtype kv : {KvCacheDtype::bf16, KvCacheDtype::fp8_e4m3}) {
    for (const std::vector<int64_t>& start : kStarts) {
      const int64_t B = int64_t(start.size());
      SCOPED_TRACE(fmt::format("kv {} B {}", kv_name(kv), B));
      const auto tables = testing::interleaved_page_tables(B, kPagesPerReq);
      const int64_t pages = B * kPagesPerReq + 1;
      KvCache ce = KvCache::create(m->config(), pages, kPs, true, Device::cuda, kv);
      KvCache cg = KvCache::create(m->config(), pages, kPs, true, Device::cuda, kv);
      std::vector<int64_t> lens(start.size());
      for (size_t r = 0; r < start.size(); ++r) lens[r] = start[r] + 1;
      const std::vector<Tensor> last = prefill(*m, ce, lens, tables, true);
      (void)prefill(*m, cg, lens, tables, true);
      model::ForwardOptions fo;
      fo.all_logits = false;
      runtime::SpecGraphRunner graphs(*m, cg, int32_t(B * kPagesPerReq), 8, fo, 3);
      const double cap_s = graphs.capture_all();
      ASSERT_FALSE(graphs.draft_stats().disabled) << "a start-up capture failed (its warning is above)";
      const int64_t graphs0 = graphs.draft_stats().graphs;
      EXPECT_EQ(graphs0, 4) << "buckets 1, 2, 4, 8 at context 32";
      Tensor h = stack(last);  // [B, H]
      std::vector<int32_t> cur(static_cast<size_t>(B));
      for (int64_t r = 0; r < B; ++r) cur[size_t(r)] = testing::graph_token(r, lens[size_t(r)], V);
      Diff logits, hidden;
      for (int s = 0; s < kSteps; ++s) {
        // Draft step s: one token per request at position len - 1 + s (draft_and_verify's batch).
        ForwardBatch db;
        db.page_size = kPs;
        for (int64_t r = 0; r < B; ++r)
          db.add_request(std::span<const int32_t>(&cur[size_t(r)], 1), lens[size_t(r)] - 1 + s,
                         tables[size_t(r)], true);
        model::ForwardOptions mo;
        mo.all_logits = true;
        mo.keep_hidden = true;
        const model::ForwardOutput e = m->forward_mtp(db, h, ce, mo, 0);
        std::optional<model::ForwardOutput> g = graphs.draft(db, h);
        ASSERT_TRUE(g.has_value()) << "step " << s << " did not replay (a capture failed?)";
        ASSERT_EQ(g->logits.size(0), B);
        logits.add(e.logits, g->logits, true);
        hidden.add(e.hidden, g->hidden, false);
        // Both sides draft the eager choice next, fed the eager hidden states: new inputs every step.
        const Tensor lg = e.logits.to(Device::cpu);
        for (int64_t r = 0; r < B; ++r) cur[size_t(r)] = int32_t(argmax_row(lg.data<float>() + r * V, V));
        h = e.hidden;
      }
      const runtime::CudaGraphStats st = graphs.draft_stats();
      fmt::print(
          "RESULT spec_graph realdims draft kv={} B={} steps={} logits max_abs={:.3g} max_rel={:.3g} "
          "median_rel={:.3g} hidden max_rel={:.3g} argmax_agree={}/{} graphs={} (start-up {} in {:.1f} ms) "
          "replays={}\n",
          kv_name(kv), B, kSteps, logits.worst_abs, logits.max_rel(), logits.median_rel(), hidden.max_rel(),
          logits.agree, logits.rows, st.graphs, graphs0, cap_s * 1e3, st.replays);
      EXPECT_EQ(st.replays, kSteps);
      EXPECT_GT(st.graphs, graphs0) << "a longer context bucket should have been captured lazily";
      expect_close(logits, hidden, B, kv);
    }
  }
}

// The engine end to end (what `generate` / `serve --device cuda --speculative-*` run): greedy output
// with speculation through verify / draft graphs equals plain greedy decoding (decode graphs), token for
// token, for one request at a time; with three concurrent requests (verify and draft batches padded to 4)
// the agreement is printed and most tokens must agree (batch invariance aside). Each setting runs the
// MTP layer's own drafts and an oracle drafter (plain's tokens with planted mistakes), so drafts are
// accepted and rolled back through the graphs.
TEST(CudaSpecGraph, RealdimsGreedyWithSpeculationAndGraphsEqualsPlainGreedy) {
  DSA_SKIP_WITHOUT_GPU();
  DSA_FIXTURE_PATH(dir, "models/realdims");
  const std::shared_ptr<const Model> m = realdims_mtp(dir);
  const int64_t V = m->config().vocab_size, kNew = 24;
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t i = 0; i < 3; ++i) {
    std::vector<int32_t> p;
    for (int64_t t = 0; t < 9 + 11 * i; ++t) p.push_back(int32_t((13 * i + 29 * t + 3) % V));
    prompts.push_back(std::move(p));
  }
  auto config = [] {
    runtime::EngineConfig ec;
    ec.kv_pages = 32;
    ec.page_size = kPs;
    ec.cuda_graph_max_bs = 8;
    ec.cuda_graph_log = false;
    ec.check_integrity = true;
    return ec;
  };
  // Greedy ids per request id (ids 0..n-1 of `which`), submitted together.
  auto run = [&](runtime::Engine& e, const std::vector<size_t>& which) {
    std::map<uint64_t, std::vector<int32_t>> out;
    for (size_t i : which) {
      runtime::GenerateRequest g;
      g.id = i;
      g.prompt = prompts[i];
      g.params.max_new_tokens = kNew;
      g.params.ignore_eos = true;
      g.params.temperature = 0.0f;  // greedy (SamplingParams' default, 1, samples with a random seed)
      e.submit(std::move(g));
    }
    std::vector<runtime::StepOutput> outs;
    while (e.step()) {
      e.wait_outputs(outs, std::chrono::milliseconds(0));
    }
    e.wait_outputs(outs, std::chrono::milliseconds(0));
    for (const runtime::StepOutput& o : outs) {
      EXPECT_NE(o.finish, runtime::FinishReason::error) << o.error;
      if (o.token >= 0) out[o.id].push_back(o.token);
    }
    return out;
  };
  // Plain greedy of the same requests submitted together (one request alone is compared with itself
  // alone, not with a batch of three).
  const std::vector<std::vector<size_t>> sets{{0}, {1}, {0, 1, 2}};
  std::map<std::vector<size_t>, std::map<uint64_t, std::vector<int32_t>>> wants;
  for (const std::vector<size_t>& which : sets) {
    runtime::Engine plain(m, config());
    wants[which] = run(plain, which);
  }
  for (bool oracle : {false, true}) {
    for (const std::vector<size_t>& which : sets) {
      const std::map<uint64_t, std::vector<int32_t>>& want = wants.at(which);
      runtime::EngineConfig ec = config();
      ec.speculative.algorithm = "EAGLE";
      ec.speculative.num_steps = 3;
      if (oracle) {
        ec.spec_draft_hook = [&](uint64_t id, int64_t index, int32_t proposed) -> int32_t {
          const int64_t o = index - int64_t(prompts[id].size());
          const auto& w = want.at(id);
          if (o < 0 || o >= int64_t(w.size())) return proposed;
          return index % 5 == 2 ? int32_t((w[size_t(o)] + 1) % V) : w[size_t(o)];
        };
      }
      runtime::Engine spec(m, ec);
      const auto got = run(spec, which);
      const runtime::EngineStats st = spec.stats();
      int64_t agree = 0, total = 0;
      for (size_t i : which) {
        const auto& g = got.count(i) ? got.at(i) : std::vector<int32_t>();
        const auto& w = want.at(i);
        size_t same = 0;
        while (same < g.size() && same < w.size() && g[same] == w[same]) ++same;
        agree += int64_t(same);
        total += int64_t(w.size());
        if (which.size() == 1) {
          EXPECT_EQ(g, w) << "request " << i << (oracle ? " oracle" : " mtp");
        }
      }
      fmt::print(
          "RESULT spec_graph realdims greedy requests={} drafter={} steps=3 agree={}/{} (leading tokens "
          "equal "
          "to plain greedy) rounds={} accepted={}/{} graphs={} replays={}\n",
          which.size(), oracle ? "oracle" : "mtp", agree, total, st.spec_rounds, st.spec_accepted_tokens,
          st.spec_drafted_tokens, st.cuda_graphs, st.cuda_graph_replays);
      EXPECT_GE(double(agree), 0.75 * double(total));
      EXPECT_GT(st.spec_rounds, 0);
      EXPECT_GT(st.cuda_graphs, 0) << "speculation captured no verify / draft graphs";
      EXPECT_GT(st.cuda_graph_replays, 0);
      if (oracle) {
        EXPECT_GT(st.spec_accepted_tokens, 0);
      }
    }
  }
}

}  // namespace
}  // namespace dsaserve
