// Host side of the GPU sampler: validates the requests, packs them (descriptors, bias / history lists)
// into device buffers, launches sampling.cu's kernels and copies the tokens and log-probabilities back.
#include "kernels/cuda/sampling/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cuda/common/check.h"
#include "kernels/cuda/common/views.h"
#include "kernels/cuda/sampling/sampling_params.h"

namespace dsaserve::kernels::cuda {

namespace {

void check_request(const SampleRequest& q, size_t row, int64_t vocab) {
  DSA_CHECK(std::isfinite(q.temperature) && q.temperature >= 0.0f && q.temperature <= 100.0f,
            "sample_rows: row {}: temperature must be in [0, 100], got {}", row, q.temperature);
  DSA_CHECK(std::isfinite(q.top_p) && q.top_p > 0.0f && q.top_p <= 1.0f,
            "sample_rows: row {}: top_p must be in (0, 1], got {}", row, q.top_p);
  DSA_CHECK(std::isfinite(q.min_p) && q.min_p >= 0.0f && q.min_p <= 1.0f,
            "sample_rows: row {}: min_p must be in [0, 1], got {}", row, q.min_p);
  DSA_CHECK(std::isfinite(q.presence_penalty) && std::isfinite(q.frequency_penalty),
            "sample_rows: row {}: presence / frequency penalties must be finite", row);
  DSA_CHECK(std::isfinite(q.repetition_penalty) && q.repetition_penalty > 0.0f,
            "sample_rows: row {}: repetition_penalty must be > 0, got {}", row, q.repetition_penalty);
  DSA_CHECK(q.top_logprobs >= 0 && q.top_logprobs <= kSampleMaxTopLogprobs,
            "sample_rows: row {}: top_logprobs must be in [0, {}], got {}", row, kSampleMaxTopLogprobs,
            q.top_logprobs);
  DSA_CHECK(q.temperature == 0.0f || (q.uniform >= 0.0 && q.uniform < 1.0),
            "sample_rows: row {}: the uniform draw must be in [0, 1), got {}", row, q.uniform);
  for (const auto& [tok, bias] : q.logit_bias) {
    DSA_CHECK(tok >= 0 && tok < vocab, "sample_rows: row {}: logit_bias token {} is outside [0, {})", row,
              tok, vocab);
    DSA_CHECK(std::isfinite(bias), "sample_rows: row {}: logit_bias value {} is not finite", row, bias);
  }
}

// Checks that the ids are in [0, vocab) and distinct (`mark` is all zero before and after).
template <class Id>
void check_distinct(std::span<const Id> list, int32_t (*id)(const Id&), std::vector<uint8_t>& mark,
                    size_t row, int64_t vocab, const char* what) {
  size_t bad = list.size();
  for (size_t j = 0; j < list.size() && bad == list.size(); ++j) {
    const int32_t t = id(list[j]);
    DSA_CHECK(t >= 0 && t < vocab, "sample_rows: row {}: {} token {} is outside [0, {})", row, what, t,
              vocab);
    if (mark[size_t(t)]) bad = j;
    mark[size_t(t)] = 1;
  }
  for (const Id& x : list) mark[size_t(id(x))] = 0;
  DSA_CHECK(bad == list.size(), "sample_rows: row {}: {} lists token {} twice", row, what, id(list[bad]));
}

size_t align8(size_t n) { return (n + 7) & ~size_t(7); }

// Pinned host staging for the upload (which 0) and the download (1): per thread, grown as needed, never
// freed. A call ends with its download, so the buffers are idle between calls; `pending` marks a call
// that threw between its upload and its download (the next call then waits for the device first).
struct Staging {
  void* p[2] = {nullptr, nullptr};
  size_t cap[2] = {0, 0};
  bool pending = false;
};
thread_local Staging t_staging;

uint8_t* staging(int which, size_t n) {
  Staging& st = t_staging;
  if (n > st.cap[which]) {
    if (st.p[which] != nullptr) DSA_CUDA_CHECK(cudaFreeHost(st.p[which]));
    st.p[which] = nullptr;
    st.cap[which] = 0;
    const size_t cap = std::max(n, size_t(1) << 16);
    DSA_CUDA_CHECK(cudaMallocHost(&st.p[which], cap));
    st.cap[which] = cap;
  }
  return static_cast<uint8_t*>(st.p[which]);
}

}  // namespace

std::vector<SampleOutput> sample_rows(const Tensor& logits, std::span<const SampleRequest> rows) {
  const RowView lv = rows_f32(logits, "sample_rows logits");
  const int64_t V = lv.cols;
  DSA_CHECK(lv.rows == int64_t(rows.size()), "sample_rows: logits have {} rows for {} requests", lv.rows,
            rows.size());
  DSA_CHECK(V > 0 && V < kSampleMaxVocab, "sample_rows: vocabulary {} outside [1, {})", V, kSampleMaxVocab);
  const size_t R = rows.size();
  if (R == 0) return {};

  std::vector<SampleRowDesc> desc(R);
  std::vector<int32_t> ints;  // bias tokens | seen | count tokens | counts
  std::vector<float> bias_val;
  std::vector<uint8_t> mark;  // [V] for the distinct-id checks, only when a row has penalty lists
  size_t n_bias = 0, n_seen = 0, n_count = 0;
  for (const SampleRequest& q : rows) {
    n_bias += q.logit_bias.size();
    n_seen += q.repetition_penalty != 1.0f ? q.seen_tokens.size() : 0;
    n_count += (q.presence_penalty != 0.0f || q.frequency_penalty != 0.0f) ? q.output_counts.size() : 0;
  }
  DSA_CHECK(n_bias + n_seen + 2 * n_count < size_t(0x7fffffff), "sample_rows: penalty lists too long");
  std::vector<int32_t> bias_tok, seen, count_tok, count_n;
  bias_tok.reserve(n_bias);
  bias_val.reserve(n_bias);
  seen.reserve(n_seen);
  count_tok.reserve(n_count);
  count_n.reserve(n_count);
  int32_t ws_rows = 0, wc_rows = 0;
  for (size_t r = 0; r < R; ++r) {
    const SampleRequest& q = rows[r];
    check_request(q, r, V);
    SampleRowDesc& d = desc[r];
    d.uniform = q.uniform;
    d.temperature = q.temperature;
    d.top_p = q.top_p;
    d.min_p = q.min_p;
    d.presence = q.presence_penalty;
    d.frequency = q.frequency_penalty;
    d.repetition = q.repetition_penalty;
    d.top_k = q.top_k;
    d.top_logprobs = q.top_logprobs;
    d.logprob = q.logprobs ? 1 : 0;
    d.bias_off = int32_t(bias_tok.size());
    for (const auto& [tok, b] : q.logit_bias) {
      bias_tok.push_back(tok);
      bias_val.push_back(b);
    }
    d.bias_n = int32_t(bias_tok.size()) - d.bias_off;
    d.seen_off = int32_t(seen.size());
    if (q.repetition_penalty != 1.0f) {
      if (mark.empty()) mark.assign(size_t(V), 0);
      check_distinct<int32_t>(
          q.seen_tokens, [](const int32_t& t) { return t; }, mark, r, V, "seen_tokens");
      seen.insert(seen.end(), q.seen_tokens.begin(), q.seen_tokens.end());
    }
    d.seen_n = int32_t(seen.size()) - d.seen_off;
    d.count_off = int32_t(count_tok.size());
    if (q.presence_penalty != 0.0f || q.frequency_penalty != 0.0f) {
      using P = std::pair<int32_t, int32_t>;
      if (mark.empty()) mark.assign(size_t(V), 0);
      check_distinct<P>(
          q.output_counts, [](const P& c) { return c.first; }, mark, r, V, "output_counts");
      for (const auto& [tok, n] : q.output_counts) {
        DSA_CHECK(n > 0, "sample_rows: row {}: output_counts: token {} has count {}", r, tok, n);
        count_tok.push_back(tok);
        count_n.push_back(n);
      }
    }
    d.count_n = int32_t(count_tok.size()) - d.count_off;
    d.ws_row = (d.bias_n > 0 || d.seen_n > 0 || d.count_n > 0) ? ws_rows++ : -1;
    // A filtered draw without top_k may take the radix select (several passes over the weights).
    const bool has_k = q.top_k > 0 && q.top_k < V;
    const bool cache = q.temperature > 0.0f && !has_k && (q.top_p < 1.0f || q.min_p > 0.0f);
    d.wc_row = cache && wc_rows < kSampleWeightCacheRows ? wc_rows++ : -1;
  }

  // One upload: descriptors, then the int32 lists, then the bias values (8-byte aligned sections).
  const size_t desc_bytes = align8(R * sizeof(SampleRowDesc));
  const size_t ints_n = bias_tok.size() + seen.size() + count_tok.size() + count_n.size();
  const size_t ints_bytes = align8(ints_n * sizeof(int32_t));
  const size_t in_bytes = desc_bytes + ints_bytes + align8(bias_val.size() * sizeof(float));
  if (t_staging.pending) {
    DSA_CUDA_CHECK(cudaDeviceSynchronize());
    t_staging.pending = false;
  }
  uint8_t* host_in = staging(0, in_bytes);
  std::memset(host_in, 0, in_bytes);
  std::memcpy(host_in, desc.data(), R * sizeof(SampleRowDesc));
  int32_t* hi = reinterpret_cast<int32_t*>(host_in + desc_bytes);
  const size_t o_bias = 0, o_seen = bias_tok.size(), o_ct = o_seen + seen.size(),
               o_cn = o_ct + count_tok.size();
  std::memcpy(hi + o_bias, bias_tok.data(), bias_tok.size() * sizeof(int32_t));
  std::memcpy(hi + o_seen, seen.data(), seen.size() * sizeof(int32_t));
  std::memcpy(hi + o_ct, count_tok.data(), count_tok.size() * sizeof(int32_t));
  std::memcpy(hi + o_cn, count_n.data(), count_n.size() * sizeof(int32_t));
  std::memcpy(host_in + desc_bytes + ints_bytes, bias_val.data(), bias_val.size() * sizeof(float));

  // Outputs: tokens [R], logprobs [R], top ids [R, 20], top logprobs [R, 20] (4 bytes each).
  const size_t K = kSampleMaxTopLogprobs, out_n = R * (2 + 2 * K);
  Tensor in_dev = Tensor::empty({int64_t(in_bytes)}, DType::u8, Device::cuda);
  Tensor out_dev = Tensor::empty({int64_t(out_n)}, DType::i32, Device::cuda);
  Tensor ws = ws_rows > 0 ? Tensor::empty({ws_rows, V}, DType::f32, Device::cuda) : Tensor();
  Tensor wc = wc_rows > 0 ? Tensor::empty({wc_rows, V}, DType::i64, Device::cuda) : Tensor();
  // Small batches: a grid pre-pass splits each row over `parts` blocks (about two blocks an SM in all)
  // for the row maximum and mass, so that R = 1 does not read the row with one SM.
  const int32_t parts = R <= 64 ? int32_t(std::min<size_t>(128, (264 + R - 1) / R)) : 0;
  // [rows * parts] each: weight sums (8 bytes), then maxima (4 bytes) and their ids (4 bytes).
  Tensor part = parts > 0 ? Tensor::empty({int64_t(R) * parts * 2}, DType::i64, Device::cuda) : Tensor();
  DSA_CUDA_CHECK(cudaMemcpyAsync(in_dev.raw_data(), host_in, in_bytes, cudaMemcpyHostToDevice, op_stream()));
  t_staging.pending = true;

  uint8_t* dev_in = static_cast<uint8_t*>(in_dev.raw_data());
  const int32_t* di = reinterpret_cast<const int32_t*>(dev_in + desc_bytes);
  int32_t* dout = out_dev.data<int32_t>();
  SampleKernelParams p{};
  p.logits = lv.p;
  p.rows = int64_t(R);
  p.vocab = V;
  p.stride = lv.stride;
  p.desc = reinterpret_cast<const SampleRowDesc*>(dev_in);
  p.bias_tok = di + o_bias;
  p.seen_tok = di + o_seen;
  p.count_tok = di + o_ct;
  p.count_n = di + o_cn;
  p.bias_val = reinterpret_cast<const float*>(dev_in + desc_bytes + ints_bytes);
  p.ws = ws_rows > 0 ? ws.data<float>() : nullptr;
  p.wcache = wc_rows > 0 ? static_cast<unsigned long long*>(wc.raw_data()) : nullptr;
  p.parts = parts;
  if (parts > 0) {
    uint8_t* pb = static_cast<uint8_t*>(part.raw_data());
    const size_t n_part = R * size_t(parts);
    p.part_w = reinterpret_cast<unsigned long long*>(pb);
    p.part_v = reinterpret_cast<float*>(pb + n_part * 8);
    p.part_i = reinterpret_cast<int32_t*>(pb + n_part * 12);
  }
  p.out_token = dout;
  p.out_logprob = reinterpret_cast<float*>(dout + R);
  p.out_top_tok = dout + 2 * R;
  p.out_top_lp = reinterpret_cast<float*>(dout + 2 * R + R * K);
  check_launch(launch_sample_rows(p, op_stream()), "sample_rows");

  int32_t* host_out = reinterpret_cast<int32_t*>(staging(1, out_n * sizeof(int32_t)));
  DSA_CUDA_CHECK(cudaMemcpy(host_out, dout, out_n * sizeof(int32_t), cudaMemcpyDeviceToHost));
  t_staging.pending = false;
  std::vector<SampleOutput> res(R);
  for (size_t r = 0; r < R; ++r) {
    res[r].token = host_out[r];
    if (rows[r].logprobs || rows[r].top_logprobs > 0)
      std::memcpy(&res[r].logprob, &host_out[R + r], sizeof(float));
    const size_t n = size_t(std::min<int64_t>(rows[r].top_logprobs, V));
    res[r].top.resize(n);
    for (size_t j = 0; j < n; ++j) {
      res[r].top[j].token = host_out[2 * R + r * K + j];
      std::memcpy(&res[r].top[j].logprob, &host_out[2 * R + R * K + r * K + j], sizeof(float));
    }
  }
  return res;
}

}  // namespace dsaserve::kernels::cuda
