#pragma once
// The operator table's shared pieces (op_table.cpp: measures, row / linear / elementwise cases;
// op_table_attention.cpp: attention, indexer, MLA, MoE and dummy-fill cases): GLM-5.3 widths, the
// tolerances, and the helpers a case is built with. Internal to the table.
#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/op_table.h"
#include "kernels/tensor_compare.h"

namespace dsaserve::kernels::testing::cases {

constexpr int64_t kH = 6144, kQLora = 2048, kKvLora = 512, kRope = 64, kNope = 192, kV = 256, kHeads = 64;
constexpr int64_t kIh = 32, kId = 128, kTopk = 2048, kExperts = 256, kTopK = 8, kI = 2048, kVocab = 154880;
constexpr int64_t kPage = 64;
const std::vector<int64_t> kTokens = {1, 7, 33, 257};
constexpr double kTolElem = 1e-5, kTolAttn = 1e-4, kTolBf16 = 1e-2, kTolFp8 = 5e-2;
constexpr Check kElem{Measure::elem, kTolElem};
constexpr Check kExact{Measure::ids, 0.0};
constexpr double kF32 = 4, kI32 = 4;  // bytes per element

using Outs = std::vector<Tensor>;

Tensor on(const Tensor& t, const Backend& b);
// The weight on b's device with the forms b derives for `use` (Backend::derive_weight), as a model holds it.
WeightRef on(const WeightRef& w, const Backend& b, WeightUse use = WeightUse::linear);
Tensor ids_on(const std::vector<int32_t>& v, const Backend& b);
// A copy of its own on b's device (what an in-place operator updates: each side works on its own).
Tensor own(const Tensor& t, const Backend& b);
double weight_bytes(const WeightRef& w);
// A case over one input pair: `f(backend, inputs...)` run on each side with its own copies.
OpRun same_op(Backend& dev, Backend& ref, std::function<Outs(Backend&)> on_dev,
              std::function<Outs(Backend&)> on_ref, std::vector<Check> checks, double bytes, double flops = 0,
              bool fp8 = false);
std::vector<int32_t> random_ids(int64_t n, int64_t below, uint64_t seed);
RopeParams glm_rope(bool interleaved);  // GLM-5.3: theta 1e6; MLA interleaved, the indexer NeoX
RopeParams yarn_rope();                 // DeepSeek-V3.2's yarn

void add_row_cases(std::vector<OpCase>& t);
void add_linear_cases(std::vector<OpCase>& t);
void add_elementwise_cases(std::vector<OpCase>& t);
void add_attention_cases(std::vector<OpCase>& t);
void add_mla_cases(std::vector<OpCase>& t);
void add_moe_cases(std::vector<OpCase>& t);
void add_dummy_cases(std::vector<OpCase>& t);

}  // namespace dsaserve::kernels::testing::cases
