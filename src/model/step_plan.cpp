#include "model/step_plan.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace dsaserve::model {

const char* step_kind_name(StepKind k) {
  switch (k) {
    case StepKind::prefill: return "prefill";
    case StepKind::decode: return "decode";
    case StepKind::mixed: return "mixed";
    case StepKind::verify: return "verify";
    case StepKind::draft: return "draft";
    case StepKind::draft_extend: return "draft_extend";
  }
  return "?";
}

const char* StepPlan::trace_pass() const {
  switch (kind) {
    case StepKind::prefill:
    case StepKind::mixed: return "prefill";
    case StepKind::decode: return "decode";
    case StepKind::verify: return "verify";
    case StepKind::draft: return "draft";
    case StepKind::draft_extend: return all_decoding ? "draft_extend" : "prefill_draft_extend";
  }
  return "?";
}

StepKind step_kind(const ForwardBatch& b, bool mtp) {
  bool any_decoding = false, any_prompt = false, multi = false;
  for (int64_t r = 0; r < b.num_requests(); ++r) {
    if (b.decoding[size_t(r)] != 0) {
      any_decoding = true;
      multi = multi || b.num_new(r) > 1;
    } else {
      any_prompt = true;
    }
  }
  if (mtp) return any_decoding && !any_prompt && !multi ? StepKind::draft : StepKind::draft_extend;
  return !any_decoding ? StepKind::prefill
         : any_prompt  ? StepKind::mixed
         : multi       ? StepKind::verify
                       : StepKind::decode;
}

StepPlan StepPlan::build(const ForwardBatch& b, const StepPlanConfig& cfg) {
  const int64_t R = b.num_requests(), T = b.num_tokens();
  DSA_CHECK(int64_t(b.token_begin.size()) == R + 1 && int64_t(b.page_begin.size()) == R + 1 &&
                int64_t(b.decoding.size()) == R && int64_t(b.positions.size()) == T &&
                int64_t(b.out_cache_loc.size()) == T && b.token_begin[size_t(R)] == T && b.page_size > 0,
            "step plan: inconsistent batch layout ({} requests, {} tokens)", R, T);
  StepPlan p;
  p.page_size = b.page_size;
  p.host_rows = cfg.host_rows;
  p.index_topk = cfg.dims.topk;
  p.heads = cfg.dims.heads;

  p.kind = step_kind(b, cfg.mtp);
  p.all_decoding = b.all_decoding();

  // Per request and per token: the attention rows (each token's request and visible length).
  p.ids = b.input_ids;
  p.positions = b.positions;
  p.slots = b.out_cache_loc;
  p.row_seq.resize(size_t(T));
  p.row_len.resize(size_t(T));
  int64_t longest = 0, max_used = 1;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t a0 = b.token_begin[size_t(r)], a1 = b.token_begin[size_t(r) + 1],
                  s0 = b.start_pos[size_t(r)], S = s0 + (a1 - a0);
    for (int64_t t = a0; t < a1; ++t) {
      p.row_seq[size_t(t)] = int32_t(r);
      p.row_len[size_t(t)] = int32_t(s0 + (t - a0) + 1);
    }
    const int64_t used = (S + b.page_size - 1) / b.page_size;
    DSA_CHECK(used <= int64_t(b.pages(r).size()), "step plan: request {} of {} positions has {} pages of {}",
              r, S, b.pages(r).size(), b.page_size);
    p.token_begin.push_back(a1);
    p.start_pos.push_back(s0);
    p.used_pages.push_back(used);
    longest = std::max(longest, S);
    max_used = std::max(max_used, used);
  }
  p.max_len = longest;
  int64_t pages = max_used;
  if (cfg.capacity) {
    const StepCapacity& c = *cfg.capacity;
    DSA_CHECK(c.max_len >= longest && c.pages * b.page_size >= c.max_len,
              "step plan: context capacity {} is below the batch's longest request ({} tokens) or beyond its "
              "page table ({} pages)",
              c.max_len, longest, c.pages);
    p.max_len = c.max_len;
    pages = c.pages;
  }
  p.runs_indexer = p.index_topk > 0 && p.max_len > p.index_topk;

  // Page tables [max(R, 1), pages]: each request's used pages, then its last used page repeated (never a
  // page it does not own; the kernels read only the pages of their rows' lengths).
  const int64_t seqs = std::max<int64_t>(R, 1);
  p.page_table.assign(size_t(seqs * pages), 0);
  for (int64_t r = 0; r < R; ++r) {
    const auto pt = b.pages(r);
    const int64_t used = p.used_pages[size_t(r)];
    int32_t* row = p.page_table.data() + r * pages;
    std::copy(pt.begin(), pt.begin() + used, row);
    std::fill(row + used, row + pages, pt[size_t(used - 1)]);
  }

  // The attention form of each request (AttentionForm::automatic: automatic_uses_mha).
  for (int64_t r = 0; r < R; ++r) {
    AttentionShape s = cfg.dims;
    s.tokens = p.num_new(r);
    s.context = p.start_pos[size_t(r)];
    const bool use_mha =
        cfg.attention == AttentionForm::mha || (cfg.attention == AttentionForm::automatic &&
                                                automatic_uses_mha(cfg.mha_min_tokens, cfg.form_rule, s));
    p.mha.push_back(use_mha ? 1 : 0);
    if (!use_mha) p.absorbed.push_back(r);
  }
  if (!p.all_absorbed()) {
    for (int64_t r : p.absorbed)
      for (int64_t t = p.token_begin[size_t(r)]; t < p.token_begin[size_t(r) + 1]; ++t)
        p.absorbed_rows.push_back(int32_t(t));
  }

  // The logits rows: each request's last token (a verifying request: every token), then the extra rows;
  // none gathered when that is every row in order (a decode step) or every row is asked for.
  if (!cfg.all_logits) {
    std::vector<int32_t> rows;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t a1 = p.token_begin[size_t(r) + 1];
      const int64_t from = b.decoding[size_t(r)] != 0 ? p.token_begin[size_t(r)] : a1 - 1;
      for (int64_t t = from; t < a1; ++t) rows.push_back(int32_t(t));
    }
    rows.insert(rows.end(), b.extra_logit_rows.begin(), b.extra_logit_rows.end());
    bool identity = int64_t(rows.size()) == T;
    for (int64_t i = 0; identity && i < T; ++i) identity = rows[size_t(i)] == int32_t(i);
    if (!identity) p.logit_rows = std::move(rows);
  }

  p.layout = StepLayout{T, seqs, pages, int64_t(p.logit_rows.size()), int64_t(p.absorbed_rows.size())};
  return p;
}

void StepPlan::plan_kernels(const kernels::Ops& ops, Device d) {
  const int64_t T = num_tokens();
  const int64_t sel_k = std::min(index_topk, max_len);  // the selection's width when the indexer runs
  indexer = runs_indexer ? ops.plan_indexer_rows(
                               d, T, max_len, index_topk,
                               host_rows ? std::span<const int32_t>(row_len) : std::span<const int32_t>())
                         : kernels::IndexerRowsPlan{};
  mla = kernels::MlaRowsPlan{};
  mla_request.clear();
  if (all_absorbed()) {  // one call over every row
    mla = ops.plan_mla_rows(d, T, heads, runs_indexer ? sel_k : max_len);
    return;
  }
  for (int64_t r : absorbed) {  // one call per absorbed request (its own rows and length)
    const int64_t n = num_new(r), S = start_pos[size_t(r)] + n;
    const bool selected = runs_indexer && S > index_topk;
    mla_request.push_back(ops.plan_mla_rows(d, n, heads, selected ? sel_k : S));
  }
}

void StepPlan::pack(std::span<int32_t> out) const {
  DSA_CHECK(int64_t(out.size()) >= layout.size(), "step plan: a buffer of {} values, the layout needs {}",
            out.size(), layout.size());
  auto put = [&](int64_t off, const std::vector<int32_t>& v) {
    std::copy(v.begin(), v.end(), out.begin() + off);
  };
  put(layout.ids(), ids);
  put(layout.positions(), positions);
  put(layout.slots(), slots);
  put(layout.row_seq(), row_seq);
  put(layout.row_len(), row_len);
  put(layout.page_table(), page_table);
  put(layout.logit_rows_at(), logit_rows);
  put(layout.absorbed_rows_at(), absorbed_rows);
}

StepInputs StepPlan::bind(const Tensor& buffer) const {
  DSA_CHECK(buffer.defined() && buffer.dtype() == DType::i32 && buffer.dim() == 1 && buffer.is_contiguous() &&
                buffer.size(0) >= layout.size(),
            "step plan: inputs need a contiguous i32 buffer of {} values, got {}", layout.size(),
            buffer.defined() ? buffer.describe() : std::string("nothing"));
  StepInputs in;
  in.buffer = buffer;
  auto part = [&](int64_t off, int64_t n) { return buffer.slice(0, off, off + n); };
  const int64_t T = layout.tokens;
  in.ids = part(layout.ids(), T);
  in.positions = part(layout.positions(), T);
  in.slots = part(layout.slots(), T);
  in.row_seq = part(layout.row_seq(), T);
  in.row_len = part(layout.row_len(), T);
  in.page_table = part(layout.page_table(), layout.seqs * layout.pages).view({layout.seqs, layout.pages});
  if (layout.logit_rows > 0) in.logit_rows = part(layout.logit_rows_at(), layout.logit_rows);
  if (layout.absorbed_rows > 0) in.absorbed_rows = part(layout.absorbed_rows_at(), layout.absorbed_rows);
  for (int64_t r = 0; r < num_requests(); ++r)
    in.page_tables.push_back(in.page_table.select(0, r).slice(0, 0, used_pages[size_t(r)]));
  return in;
}

StepInputs StepPlan::upload(Device d) const {
  Tensor host = Tensor::empty({std::max<int64_t>(layout.size(), 1)}, DType::i32);
  pack(std::span<int32_t>(host.data<int32_t>(), size_t(host.size(0))));
  return bind(d == Device::cpu ? host : host.to(d));  // one copy
}

}  // namespace dsaserve::model
