#include "model/score.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "kernels/ops.h"

namespace dsaserve::model {

std::vector<std::pair<int64_t, int64_t>> score_schedule(int64_t n, const ScoreOptions& opt) {
  DSA_CHECK(n > 0, "cannot score an empty sequence");
  DSA_CHECK(opt.chunk >= 0, "chunk size must be >= 0, got {}", opt.chunk);
  const int64_t prefill_end = opt.decode_from >= 0 ? std::clamp<int64_t>(opt.decode_from, 1, n) : n;
  std::vector<std::pair<int64_t, int64_t>> steps;
  const int64_t chunk = opt.chunk > 0 ? opt.chunk : prefill_end;
  for (int64_t b = 0; b < prefill_end; b += chunk) steps.emplace_back(b, std::min(prefill_end, b + chunk));
  for (int64_t p = prefill_end; p < n; ++p) steps.emplace_back(p, p + 1);
  return steps;
}

namespace {

void copy_rows_into(Tensor& dst, int64_t row0, const Tensor& src) {
  const Tensor s = src.device() == Device::cpu ? src : src.to(Device::cpu);
  DSA_CHECK(s.is_contiguous() && s.dtype() == DType::f32, "score: unexpected logits {}", s.describe());
  std::memcpy(static_cast<float*>(dst.raw_data()) + row0 * dst.size(1), s.raw_data(), s.nbytes());
}

}  // namespace

std::vector<int32_t> dp_companion(std::span<const int32_t> ids, int64_t dp_rank) {
  std::vector<int32_t> out(ids.rbegin(), ids.rend());
  if (dp_rank > 0) out.resize(size_t(std::max<int64_t>(1, int64_t(ids.size()) - dp_rank)));
  return out;
}

ScoreResult score_sequence(const Model& model, std::span<const int32_t> all_ids, const ScoreOptions& opt) {
  // Attention DP: every rank knows every DP group's sequence, so each step's token counts (dp_tokens).
  const int64_t dp = opt.dist != nullptr ? model.shard().layout.attn_dp_size : 1;
  const int64_t dp_rank = model.shard().layout.attn_dp_rank(model.shard().rank);
  std::vector<std::vector<int32_t>> seqs;
  for (int64_t d = 0; d < dp; ++d)
    seqs.push_back(d == 0 ? std::vector<int32_t>(all_ids.begin(), all_ids.end()) : dp_companion(all_ids, d));
  const std::span<const int32_t> ids = seqs[size_t(dp > 1 ? dp_rank : 0)];
  const int64_t n = int64_t(ids.size());
  DSA_CHECK(n > 0, "cannot score an empty sequence");
  DSA_CHECK(!opt.mtp || model.num_mtp_layers() > 0, "--mtp: the model was loaded without MTP layers");
  const ModelConfig& c = model.config();
  const int64_t pages = (n + opt.page_size - 1) / opt.page_size;
  KvCache cache = model.make_cache(pages, opt.page_size);
  // Pages in reverse order so that paging is exercised (position 0 is not slot 0).
  std::vector<int32_t> table(static_cast<size_t>(pages));
  std::iota(table.rbegin(), table.rend(), 0);

  ScoreResult res;
  res.logits = Tensor::empty({n, c.vocab_size}, DType::f32);
  Tensor hidden = opt.mtp ? Tensor::empty({n, c.hidden_size}, DType::f32) : Tensor();
  ForwardOptions fo;
  fo.attention = opt.attention;
  fo.keep_hidden = opt.mtp;
  fo.dist = opt.dist;
  fo.dsa_topk_broadcast = opt.dsa_topk_broadcast;
  fo.moe_a2a_deepep = opt.moe_a2a_deepep;
  fo.deepep_fp8_dispatch = opt.deepep_fp8_dispatch;
  const auto steps = score_schedule(n, opt);
  // Positions from decode_from on are decoded one per step; before it, prompt chunks (even of one token).
  auto decoding = [&](int64_t b) {
    return opt.decode_from >= 0 && b >= std::max<int64_t>(opt.decode_from, 1);
  };
  // Each DP group's steps ([begin, end) of its sequence), and the step count all of them run.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> group_steps;
  size_t rounds = steps.size();
  for (int64_t d = 0; d < dp; ++d) {
    group_steps.push_back(score_schedule(int64_t(seqs[size_t(d)].size()), opt));
    rounds = std::max(rounds, group_steps.back().size());
  }
  // Round i's token counts per DP group; a decode when every group decodes or idles. mtp: the MTP pass's
  // steps (positions 0..len-2).
  auto dp_round = [&](size_t i, bool mtp_pass) {
    fo.dp_tokens.assign(size_t(dp), 0);
    fo.dp_decode = true;
    for (int64_t d = 0; d < dp; ++d) {
      const auto& gs = group_steps[size_t(d)];
      const int64_t len = int64_t(seqs[size_t(d)].size());
      if (i >= gs.size()) continue;
      const auto [b, e0] = gs[i];
      const int64_t e = mtp_pass ? std::min(e0, len - 1) : e0;
      if (b >= e) continue;
      fo.dp_tokens[size_t(d)] = e - b;
      fo.dp_decode = fo.dp_decode && decoding(b);
    }
  };
  Device hidden_device = Device::cpu;  // where the model's hidden states live (the MTP input goes back there)
  for (size_t i = 0; i < rounds; ++i) {
    if (dp > 1) dp_round(i, false);
    if (i >= steps.size()) {
      model.idle_step(fo);
      continue;
    }
    const auto [b, e] = steps[i];
    ForwardBatch batch;
    batch.page_size = opt.page_size;
    batch.add_request(ids.subspan(size_t(b), size_t(e - b)), b, table, decoding(b));
    const ForwardOutput out = model.forward(batch, cache, fo);
    copy_rows_into(res.logits, b, out.logits);
    if (opt.mtp) {
      copy_rows_into(hidden, b, out.hidden);
      hidden_device = out.hidden.device();
    }
    ++res.steps;
  }
  if (opt.mtp && (n >= 2 || dp > 1)) {  // (attention DP: the other groups' MTP steps need this rank too)
    // MTP at position p consumes (token p+1, hidden p); same schedule over positions 0..n-2.
    if (n >= 2) res.mtp_logits = Tensor::empty({n - 1, c.vocab_size}, DType::f32);
    for (size_t i = 0; i < rounds; ++i) {
      if (dp > 1) dp_round(i, true);
      const auto [b, e0] = i < steps.size() ? steps[i] : std::pair<int64_t, int64_t>(n, n);
      const int64_t e = std::min(e0, n - 1);
      if (b >= e) {
        if (dp > 1 && std::any_of(fo.dp_tokens.begin(), fo.dp_tokens.end(), [](int64_t t) { return t > 0; }))
          model.idle_step(fo, true);
        continue;
      }
      ForwardBatch batch;
      batch.page_size = opt.page_size;
      batch.add_request(ids.subspan(size_t(b + 1), size_t(e - b)), b, table, decoding(b));
      const Tensor h = hidden.slice(0, b, e);
      const ForwardOutput out = model.forward_mtp(
          batch, hidden_device == Device::cpu ? h : h.contiguous().to(hidden_device), cache, fo, 0);
      copy_rows_into(res.mtp_logits, b, out.logits);
    }
  }
  return res;
}

std::vector<int32_t> greedy_generate(const Model& model, std::span<const int32_t> prompt, int64_t max_new,
                                     int64_t page_size) {
  DSA_CHECK(!prompt.empty(), "cannot generate from an empty prompt");
  DSA_CHECK(max_new >= 0, "max new tokens must be >= 0, got {}", max_new);
  const int64_t total = int64_t(prompt.size()) + max_new, V = model.config().vocab_size;
  const int64_t pages = (total + page_size - 1) / page_size;
  KvCache cache = model.make_cache(pages, page_size);
  std::vector<int32_t> table(static_cast<size_t>(pages));
  std::iota(table.begin(), table.end(), 0);
  ForwardOptions fo;
  fo.all_logits = false;
  std::vector<int32_t> out;
  std::vector<int32_t> step(prompt.begin(), prompt.end());
  int64_t pos = 0;
  while (int64_t(out.size()) < max_new) {
    ForwardBatch batch;
    batch.page_size = page_size;
    batch.add_request(step, pos, table, pos > 0);
    const Tensor logits = model.forward(batch, cache, fo).logits.to(Device::cpu);  // [1, V]
    const std::span<const float> row(logits.data<float>(), size_t(V));
    // The first maximum, like kernels::argmax: ties go to the lowest id.
    const int32_t next = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
    pos += int64_t(step.size());
    step.assign(1, next);
    out.push_back(next);
  }
  return out;
}

}  // namespace dsaserve::model
