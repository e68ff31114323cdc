// DeepEP's dispatch / combine payloads over all-to-all-v (model/deepep.h).
#include "model/deepep.h"

#include <cstring>

#include "core/dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "trace/trace.h"

namespace dsaserve::model {

namespace {

constexpr int64_t kGroup = 128;

int64_t meta_offset(DeepepPayload p, int64_t H) {
  return p == DeepepPayload::fp8 ? H + (H / kGroup) * int64_t(sizeof(float)) : H * int64_t(sizeof(float));
}

}  // namespace

int64_t deepep_dispatch_row_bytes(DeepepPayload p, int64_t hidden) {
  return meta_offset(p, hidden) + int64_t(sizeof(int32_t) + sizeof(float));
}

int64_t deepep_combine_row_bytes(DeepepPayload p, int64_t hidden) {
  return hidden * (p == DeepepPayload::fp8 ? 2 : 4);
}

DeepepDispatched deepep_dispatch(dist::Communicator& ep, const Tensor& h, const Tensor& ids,
                                 const Tensor& weights, int64_t experts_per_rank, DeepepPayload payload) {
  DSA_CHECK(h.defined() && h.dim() == 2 && h.dtype() == DType::f32 && h.device() == Device::cpu &&
                h.is_contiguous(),
            "deepep dispatch: rows {} (contiguous CPU f32 [n, H] expected)", h.describe());
  const int64_t n = h.size(0), H = h.size(1), P = ep.size(), El = experts_per_rank;
  DSA_CHECK(payload != DeepepPayload::fp8 || H % kGroup == 0,
            "deepep dispatch: FP8 payloads need whole groups of {} columns (hidden {})", kGroup, H);
  DSA_CHECK(El >= 1, "deepep dispatch: {} experts per rank", El);
  const int64_t k = n > 0 ? ids.size(1) : 0;
  if (n > 0) {
    DSA_CHECK(ids.dim() == 2 && ids.size(0) == n && ids.dtype() == DType::i32 && ids.is_contiguous() &&
                  ids.device() == Device::cpu && weights.defined() && weights.dim() == 2 &&
                  weights.size(0) == n && weights.size(1) == k && weights.dtype() == DType::f32 &&
                  weights.is_contiguous() && weights.device() == Device::cpu,
              "deepep dispatch: routing {} / {} does not match {} rows", ids.describe(), weights.describe(),
              n);
  }
  DeepepDispatched d;
  d.rows = n;
  d.picks = k;
  d.hidden = H;
  d.payload = payload;
  d.send.assign(size_t(P), 0);
  d.recv.assign(size_t(P), 0);
  // The pairs by destination rank, in row order within each.
  std::vector<std::vector<int64_t>> to(static_cast<size_t>(P));
  const int32_t* ip = n > 0 ? ids.data<int32_t>() : nullptr;
  for (int64_t p = 0; p < n * k; ++p) {
    const int64_t q = ip[p] >= 0 ? ip[p] / El : -1;
    DSA_CHECK(q >= 0 && q < P, "deepep dispatch: expert {} of row {} outside the EP group's {} experts",
              ip[p], p / k, P * El);
    to[size_t(q)].push_back(p);
  }
  Tensor sc = Tensor::empty({P}, DType::i64), rc = Tensor::empty({P}, DType::i64);
  for (int64_t q = 0; q < P; ++q) {
    sc.data<int64_t>()[q] = d.send[size_t(q)] = int64_t(to[size_t(q)].size());
    d.order.insert(d.order.end(), to[size_t(q)].begin(), to[size_t(q)].end());
  }
  ep.all_to_all(sc, rc, "ep_dispatch_layout");
  int64_t R = 0;
  for (int64_t q = 0; q < P; ++q) {
    const int64_t c = rc.data<int64_t>()[q];
    DSA_CHECK(c >= 0, "deepep dispatch: rank {} announces {} pairs", q, c);
    R += d.recv[size_t(q)] = c;
  }

  // This rank's rows quantised once (fp8), each pair's row copied from them.
  const int64_t G = H / kGroup, rb = deepep_dispatch_row_bytes(payload, H), meta = meta_offset(payload, H);
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  const float* hx = n > 0 ? h.data<float>() : nullptr;
  if (payload == DeepepPayload::fp8) {
    codes.resize(size_t(n * H));
    scales.resize(size_t(n * G));
    for (int64_t r = 0; r < n; ++r)
      kernels::cpu::fp8_quantize_row128(hx + r * H, H, codes.data() + r * H, scales.data() + r * G);
  }
  const int64_t pairs = int64_t(d.order.size());
  Tensor out = Tensor::empty({pairs, rb}, DType::u8);
  {
    uint8_t* o = out.data_u8();
    int64_t i = 0;
    for (int64_t q = 0; q < P; ++q) {
      for (int64_t p : to[size_t(q)]) {
        uint8_t* row = o + (i++) * rb;
        const int64_t r = p / k;
        if (payload == DeepepPayload::fp8) {
          std::memcpy(row, codes.data() + r * H, size_t(H));
          std::memcpy(row + H, scales.data() + r * G, size_t(G) * sizeof(float));
        } else {
          std::memcpy(row, hx + r * H, size_t(H) * sizeof(float));
        }
        const int32_t local = ip[p] - int32_t(q * El);
        const float w = weights.data<float>()[p];
        std::memcpy(row + meta, &local, sizeof(local));
        std::memcpy(row + meta + 4, &w, sizeof(w));
      }
    }
  }
  Tensor in = Tensor::empty({R, rb}, DType::u8);
  ep.all_to_all_v(out, d.send, in, d.recv, "ep_dispatch");

  d.x = Tensor::empty({R, H}, DType::f32);
  d.ids = Tensor::empty({R, 1}, DType::i32);
  d.weights = Tensor::empty({R, 1}, DType::f32);
  if (payload == DeepepPayload::fp8) {
    d.q.codes = Tensor::empty({R, H}, DType::u8);
    d.q.scales = Tensor::empty({G, R}, DType::f32);
    d.q.rows = R;
  }
  const uint8_t* src = in.data_u8();
  float* x = d.x.data<float>();
  for (int64_t i = 0; i < R; ++i) {
    const uint8_t* row = src + i * rb;
    if (payload == DeepepPayload::fp8) {
      std::memcpy(d.q.codes.data_u8() + i * H, row, size_t(H));
      float* sg = d.q.scales.data<float>();
      for (int64_t g = 0; g < G; ++g) {
        float s;
        std::memcpy(&s, row + H + g * 4, sizeof(s));
        sg[g * R + i] = s;
        for (int64_t c = g * kGroup; c < (g + 1) * kGroup; ++c) x[i * H + c] = f8e4m3fn_to_f32(row[c]) * s;
      }
    } else {
      std::memcpy(x + i * H, row, size_t(H) * sizeof(float));
    }
    int32_t e;
    float w;
    std::memcpy(&e, row + meta, sizeof(e));
    std::memcpy(&w, row + meta + 4, sizeof(w));
    DSA_CHECK(e >= 0 && e < El, "deepep dispatch: received pair {} names local expert {} (this rank has {})",
              i, e, El);
    d.ids.data<int32_t>()[i] = e;
    d.weights.data<float>()[i] = w;
  }
  return d;
}

Tensor deepep_combine(dist::Communicator& ep, const DeepepDispatched& d, const Tensor& y) {
  const int64_t H = d.hidden, R = d.x.size(0), pairs = int64_t(d.order.size());
  DSA_CHECK(y.defined() && y.dim() == 2 && y.size(0) == R && y.size(1) == H && y.dtype() == DType::f32 &&
                y.device() == Device::cpu && y.is_contiguous(),
            "deepep combine: outputs {} for {} received pairs of {} (contiguous CPU f32)", y.describe(), R,
            H);
  const bool bf16 = d.payload == DeepepPayload::fp8;
  Tensor send = bf16 ? Tensor::empty({R, H}, DType::bf16) : y;
  if (bf16) {
    const float* yp = y.data<float>();
    uint16_t* b = static_cast<uint16_t*>(send.raw_data());
    for (int64_t i = 0; i < R * H; ++i) b[i] = f32_to_bf16(yp[i]);
  }
  Tensor back = Tensor::empty({pairs, H}, send.dtype());
  ep.all_to_all_v(send, d.recv, back, d.send, "ep_combine");
  trace::OpScope span("moe_sum");
  Tensor out = Tensor::zeros({d.rows, H}, DType::f32);
  float* o = out.data<float>();
  const int64_t k = d.picks;
  for (int64_t i = 0; i < pairs; ++i) {
    float* row = o + (d.order[size_t(i)] / k) * H;
    if (bf16) {
      const uint16_t* src = static_cast<const uint16_t*>(back.raw_data()) + i * H;
      for (int64_t c = 0; c < H; ++c) row[c] += bf16_to_f32(src[c]);
    } else {
      const float* src = back.data<float>() + i * H;
      for (int64_t c = 0; c < H; ++c) row[c] += src[c];
    }
  }
  return out;
}

}  // namespace dsaserve::model
