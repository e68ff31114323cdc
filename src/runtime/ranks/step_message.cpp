#include "runtime/ranks/step_message.h"

#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "runtime/ranks/wire.h"

namespace dsaserve::runtime {

namespace {

constexpr int64_t kMagic = 0x64736173746570;  // "dsastep": a header that is not ours fails loudly
constexpr int64_t kHeader = 4;                // magic, kind, seq, payload bytes

using wire::Reader;
using wire::Writer;

}  // namespace

const char* to_string(StepKind k) {
  switch (k) {
    case StepKind::init: return "init";
    case StepKind::step: return "step";
    case StepKind::idle: return "idle";
    case StepKind::shutdown: return "shutdown";
    case StepKind::dp_step: return "dp_step";
    case StepKind::dp_idle: return "dp_idle";
  }
  return "?";
}

model::ForwardOptions StepInit::forward(const dist::ProcessGroups* dist) const {
  model::ForwardOptions o;
  o.attention = attention;
  o.mha_min_tokens = mha_min_tokens;
  o.form_rule = form_rule;
  o.all_logits = all_logits;
  o.keep_hidden = keep_hidden;
  o.dsa_topk_broadcast = dsa_topk_broadcast;
  o.moe_a2a_deepep = moe_a2a_deepep;
  o.deepep_fp8_dispatch = deepep_fp8_dispatch;
  o.dist = dist;
  return o;
}

StepInit StepInit::of(int64_t num_pages, int64_t page_size, bool mtp_layers,
                      std::optional<model::KvCacheDtype> kv_dtype, const model::ForwardOptions& opt) {
  DSA_CHECK(opt.plan == nullptr && opt.inputs == nullptr,
            "ranks: the leader's forward options carry a step plan (each rank plans its own steps)");
  StepInit s;
  s.num_pages = num_pages;
  s.page_size = page_size;
  s.mtp_layers = mtp_layers;
  s.kv_dtype = kv_dtype;
  s.attention = opt.attention;
  s.mha_min_tokens = opt.mha_min_tokens;
  s.form_rule = opt.form_rule;
  s.all_logits = opt.all_logits;
  s.keep_hidden = opt.keep_hidden;
  s.dsa_topk_broadcast = opt.dsa_topk_broadcast;
  s.moe_a2a_deepep = opt.moe_a2a_deepep;
  s.deepep_fp8_dispatch = opt.deepep_fp8_dispatch;
  return s;
}

std::vector<uint8_t> encode_batch(const model::ForwardBatch& b) {
  Writer w;
  w.put<int64_t>(b.page_size);
  w.put_vec(b.input_ids);
  w.put_vec(b.positions);
  w.put_vec(b.out_cache_loc);
  w.put_vec(b.token_begin);
  w.put_vec(b.start_pos);
  w.put_vec(b.decoding);
  w.put_vec(b.page_begin);
  w.put_vec(b.page_indices);
  w.put_vec(b.extra_logit_rows);
  return w.take();
}

model::ForwardBatch decode_batch(const std::vector<uint8_t>& bytes) {
  Reader r(bytes);
  model::ForwardBatch b;
  b.page_size = r.get<int64_t>();
  b.input_ids = r.get_vec<int32_t>();
  b.positions = r.get_vec<int32_t>();
  b.out_cache_loc = r.get_vec<int32_t>();
  b.token_begin = r.get_vec<int64_t>();
  b.start_pos = r.get_vec<int64_t>();
  b.decoding = r.get_vec<uint8_t>();
  b.page_begin = r.get_vec<int64_t>();
  b.page_indices = r.get_vec<int32_t>();
  b.extra_logit_rows = r.get_vec<int32_t>();
  r.done();
  return b;
}

std::vector<uint8_t> encode_init(const StepInit& s) {
  static_assert(std::is_trivially_copyable_v<model::AttentionFormRule>);
  Writer w;
  w.put(s.num_pages);
  w.put(s.page_size);
  w.put<uint8_t>(s.mtp_layers);
  w.put<int64_t>(s.kv_dtype ? int64_t(*s.kv_dtype) : -1);
  w.put<int64_t>(int64_t(s.attention));
  w.put(s.mha_min_tokens);
  w.put(s.form_rule);
  w.put<uint8_t>(s.all_logits);
  w.put<uint8_t>(s.keep_hidden);
  w.put<uint8_t>(s.dsa_topk_broadcast);
  w.put<uint8_t>(s.moe_a2a_deepep);
  w.put<uint8_t>(s.deepep_fp8_dispatch);
  return w.take();
}

StepInit decode_init(const std::vector<uint8_t>& bytes) {
  Reader r(bytes);
  StepInit s;
  s.num_pages = r.get<int64_t>();
  s.page_size = r.get<int64_t>();
  s.mtp_layers = r.get<uint8_t>() != 0;
  const auto kv = r.get<int64_t>();
  DSA_CHECK(kv >= -1 && kv <= int64_t(model::KvCacheDtype::fp8_e4m3), "step message: KV dtype {}", kv);
  if (kv >= 0) s.kv_dtype = model::KvCacheDtype(kv);
  const auto form = r.get<int64_t>();
  DSA_CHECK(form >= 0 && form <= int64_t(model::AttentionForm::absorbed), "step message: attention form {}",
            form);
  s.attention = model::AttentionForm(form);
  s.mha_min_tokens = r.get<int64_t>();
  s.form_rule = r.get<model::AttentionFormRule>();
  s.all_logits = r.get<uint8_t>() != 0;
  s.keep_hidden = r.get<uint8_t>() != 0;
  s.dsa_topk_broadcast = r.get<uint8_t>() != 0;
  s.moe_a2a_deepep = r.get<uint8_t>() != 0;
  s.deepep_fp8_dispatch = r.get<uint8_t>() != 0;
  r.done();
  DSA_CHECK(s.num_pages > 0 && s.page_size > 0, "step message: a KV cache of {} pages of {} tokens",
            s.num_pages, s.page_size);
  return s;
}

void send_step_message(dist::Communicator& control, const StepMessage& m) {
  DSA_CHECK(control.rank() == 0, "ranks: only rank 0 sends steps (this is rank {})", control.rank());
  std::vector<uint8_t> payload;
  if (m.kind == StepKind::init) payload = encode_init(m.init);
  if (m.kind == StepKind::step) payload = encode_batch(m.batch);
  if (m.kind == StepKind::dp_step || m.kind == StepKind::dp_idle) {
    // The DP groups' token counts and decode flag, then (dp_step) the batch.
    Writer w;
    w.put_vec(m.dp_tokens);
    w.put<uint8_t>(m.dp_decode);
    payload = w.take();
    if (m.kind == StepKind::dp_step) {
      const std::vector<uint8_t> b = encode_batch(m.batch);
      payload.insert(payload.end(), b.begin(), b.end());
    }
  }
  Tensor head = Tensor::empty({kHeader}, DType::i64);
  int64_t* h = head.data<int64_t>();
  h[0] = kMagic;
  h[1] = int64_t(m.kind);
  h[2] = m.seq;
  h[3] = int64_t(payload.size());
  control.broadcast(head, 0, "step_header_broadcast");
  if (payload.empty()) return;
  Tensor body = Tensor::empty({int64_t(payload.size())}, DType::u8);
  std::memcpy(body.raw_data(), payload.data(), payload.size());
  control.broadcast(body, 0, "step_broadcast");
}

StepMessage receive_step_message(dist::Communicator& control) {
  Tensor head = Tensor::empty({kHeader}, DType::i64);
  control.broadcast(head, 0, "step_header_broadcast");
  const int64_t* h = head.data<int64_t>();
  DSA_CHECK(h[0] == kMagic, "ranks: rank {} received a step header that is not one", control.rank());
  DSA_CHECK(h[1] >= int64_t(StepKind::init) && h[1] <= int64_t(StepKind::dp_idle),
            "ranks: step message kind {}", h[1]);
  DSA_CHECK(h[3] >= 0 && h[3] < (int64_t(1) << 32), "ranks: a step payload of {} bytes", h[3]);
  StepMessage m;
  m.kind = StepKind(h[1]);
  m.seq = h[2];
  if (h[3] == 0) return m;
  Tensor body = Tensor::empty({h[3]}, DType::u8);
  control.broadcast(body, 0, "step_broadcast");
  const auto* p = static_cast<const uint8_t*>(body.raw_data());
  const std::vector<uint8_t> payload(p, p + h[3]);
  if (m.kind == StepKind::init) m.init = decode_init(payload);
  if (m.kind == StepKind::step) m.batch = decode_batch(payload);
  if (m.kind == StepKind::dp_step || m.kind == StepKind::dp_idle) {
    Reader r(payload);
    m.dp_tokens = r.get_vec<int64_t>();
    m.dp_decode = r.get<uint8_t>() != 0;
    const size_t used = payload.size() - r.remaining();
    if (m.kind == StepKind::dp_idle) r.done();
    if (m.kind == StepKind::dp_step)
      m.batch = decode_batch(std::vector<uint8_t>(payload.begin() + long(used), payload.end()));
  }
  return m;
}

}  // namespace dsaserve::runtime
