// The weights' derived forms (kernels/ops.h DerivedWeight and DerivedExperts, made by a backend at model
// load): which slots a model has and what the forward runs on each (for_each_derived_slot, for_each_moe),
// none on the CPU, and copies to another device drop them (they belong to the backend that made them). The
// CUDA forms and their bits: tests/kernels/cuda/ops_test.cpp CudaOps.DerivedWeightFormsChangeNoBit,
// tests/kernels/cuda/moe/moe_test.cpp CudaMoe.DerivedExpertTableChangesNoBit.
#include <gtest/gtest.h>

#include <map>

#include "common/fixtures.h"
#include "kernels/ops.h"
#include "model/dummy_weights.h"
#include "model/model.h"

namespace dsaserve::model {
namespace {

using kernels::DerivedWeight;
using kernels::WeightUse;

ModelConfig tiny_config() {
  return ModelConfig::from_file(testing::repo_dir() / "configs/dsaserve-tiny.json");
}

TEST(DerivedWeights, EverySlotWithItsUse) {
  const ModelConfig c = tiny_config();  // 4 layers (1 dense, 3 MoE of 16 experts and a shared one), 1 MTP
  ModelWeights w = make_dummy_weights(c, Device::cpu, 3, true);
  ASSERT_EQ(w.mtp.size(), 1u);
  std::map<WeightUse, int64_t> uses;
  int64_t undefined = 0, kv_b = 0;
  for_each_derived_slot(
      w, [&](const Tensor& weight, const Tensor&, std::shared_ptr<const DerivedWeight>& d, WeightUse use) {
        ++uses[use];
        undefined += !weight.defined();
        EXPECT_EQ(d, nullptr);
      });
  int64_t experts = 0;
  auto count = [&](const LayerWeights& l) {
    kv_b += l.attn.kv_b_proj.weight.defined();
    if (l.moe) experts += int64_t(l.moe->experts.size());
  };
  for (const LayerWeights& l : w.layers) count(l);
  for (const MtpWeights& m : w.mtp) count(m.layer);
  EXPECT_EQ(undefined, 0);
  EXPECT_EQ(kv_b, c.num_hidden_layers + 1);
  EXPECT_EQ(uses[WeightUse::absorb], kv_b) << "kv_b of every layer, the MTP layer's too";
  EXPECT_GE(experts, 3 * c.n_routed_experts);
  EXPECT_EQ(uses[WeightUse::expert], experts * 3);
  EXPECT_GT(uses[WeightUse::linear], 0);
  // The routed experts as a set (MoeWeights::experts_derived): each MoE layer's, the MTP layer's too.
  int64_t moe_layers = 0;
  for_each_moe(w, [&](MoeWeights& m) {
    ++moe_layers;
    EXPECT_EQ(m.experts_derived, nullptr);
  });
  EXPECT_EQ(moe_layers, c.num_hidden_layers - c.first_k_dense_replace + 1);
}

TEST(DerivedWeights, NoneOnTheCpuAndCopiesDropThem) {
  const ModelConfig c = tiny_config();
  const auto m = make_dummy_model(c, Device::cpu, 3, true);
  ModelWeights w = m->weights();
  int64_t slots = 0;
  for_each_derived_slot(
      w, [&](const Tensor&, const Tensor&, std::shared_ptr<const DerivedWeight>& d, WeightUse) {
        ++slots;
        EXPECT_EQ(d, nullptr) << "the CPU backends derive nothing";
        d = std::make_shared<const DerivedWeight>();  // as a device backend would
      });
  ASSERT_GT(slots, 0);
  for_each_moe(w, [](MoeWeights& moe) {
    EXPECT_EQ(moe.experts_derived, nullptr) << "the CPU backends derive no expert set";
    moe.experts_derived = std::make_shared<const kernels::DerivedExperts>();
  });
  ModelWeights copy = w.to(Device::cpu);
  for_each_derived_slot(copy, [&](const Tensor&, const Tensor&, std::shared_ptr<const DerivedWeight>& d,
                                  WeightUse) { EXPECT_EQ(d, nullptr); });
  for_each_moe(copy, [](MoeWeights& moe) { EXPECT_EQ(moe.experts_derived, nullptr); });
  // A model made from weights carrying forms derives its own (the CPU's: none).
  const Model again(c, io::Checkpoint{}, w);
  ModelWeights held = again.weights();
  for_each_derived_slot(held, [&](const Tensor&, const Tensor&, std::shared_ptr<const DerivedWeight>& d,
                                  WeightUse) { EXPECT_EQ(d, nullptr); });
  for_each_moe(held, [](MoeWeights& moe) { EXPECT_EQ(moe.experts_derived, nullptr); });
}

}  // namespace
}  // namespace dsaserve::model
