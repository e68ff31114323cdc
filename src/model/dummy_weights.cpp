#include "model/dummy_weights.h"

#include <cmath>
#include <regex>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace dsaserve::model {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The linears FP8 checkpoints store in e4m3 (tools/goldens.py's FP8_LINEAR, as GLM-5.x-FP8 ships).
bool fp8_linear(const std::string& name) {
  static const std::regex re(
      R"(\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj|indexer\.wq_b|gate_proj|up_proj|down_proj)\.weight$)");
  return std::regex_search(name, re);
}

// Generates each tensor the binder asks for (or, dry, only records it).
class DummySource final : public WeightSource {
 public:
  DummySource(const ModelConfig& cfg, Device device, uint64_t seed, bool dry)
      : cfg_(cfg), device_(device), seed_(seed), dry_(dry) {}

  bool has(const std::string& name) const override {
    if (name == "lm_head.weight") return !cfg_.tie_word_embeddings;
    int64_t idx = -1;
    const bool layer = std::sscanf(name.c_str(), "model.layers.%ld.", &idx) == 1;
    if (layer && idx >= cfg_.num_hidden_layers) {  // MTP: a MoE layer, the target's embeddings and head
      if (ends_with(name, ".embed_tokens.weight") || ends_with(name, ".shared_head.head.weight"))
        return false;
      if (ends_with(name, ".mlp.gate.weight")) return true;
    }
    return true;
  }

  Tensor get(const std::string& name, const Shape& shape) override {
    DummyTensor d{name, shape, DType::bf16, {seed_, tensor_key(name), 1.0f, 0.0f, false}};
    const bool scale_of_fp8 = ends_with(name, ".weight_scale_inv");
    if (scale_of_fp8) {
      // The scale of the FP8 weight recorded just before: values of RMS 1/sqrt(in) (w in [0.5, 1) has
      // RMS sqrt(7/12)).
      d.dtype = DType::f32;
      d.fill.positive = true;
      d.fill.scale =
          float(1.0 / std::sqrt(double(last_in_)) / (dummy::kDummyFp8CodeRms * std::sqrt(7.0 / 12.0)));
    } else if (ends_with(name, "norm.weight")) {
      d.fill.offset = 1.0f;
      d.fill.scale = 0x1p-4f;
    } else if (ends_with(name, "k_norm.bias")) {
      d.fill.scale = 0x1p-5f;
    } else if (ends_with(name, "e_score_correction_bias")) {
      d.dtype = DType::f32;
      d.fill.scale = 0x1p-6f;
    } else if (ends_with(name, "embed_tokens.weight")) {
      // Tied, the matrix is also the LM head: then the scale of a linear (std 1/sqrt(H)).
      d.fill.scale = cfg_.tie_word_embeddings ? float(std::sqrt(3.0 / double(shape[1]))) : 1.0f;
    } else if (shape.size() == 2) {  // a linear [out, in]: uniform of std 1/sqrt(in)
      last_in_ = shape[1];
      d.fill.scale = float(std::sqrt(3.0 / double(shape[1])));
      if (cfg_.fp8.enabled && fp8_linear(name)) d.dtype = DType::f8e4m3fn;
    }
    made_.push_back(d);
    if (d.dtype == DType::f8e4m3fn && dry_) {  // the binder asks for the scale only of a made weight
      const Shape s{(shape[0] + cfg_.fp8.block_n - 1) / cfg_.fp8.block_n,
                    (shape[1] + cfg_.fp8.block_k - 1) / cfg_.fp8.block_k};
      (void)get(name.substr(0, name.size() - 7) + ".weight_scale_inv", s);
    }
    if (dry_) return {};
    Tensor t = Tensor::empty(shape, d.dtype, device_);
    kernels::fill_dummy(t, d.fill);
    return t;
  }

  std::vector<std::string> names() const override { return {}; }  // nothing unexpected
  std::vector<DummyTensor>& made() { return made_; }

 private:
  const ModelConfig& cfg_;
  Device device_;
  uint64_t seed_;
  bool dry_;
  int64_t last_in_ = 1;
  std::vector<DummyTensor> made_;
};

}  // namespace

uint64_t tensor_key(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

std::vector<DummyTensor> dummy_tensors(const ModelConfig& cfg, uint64_t seed, bool with_mtp) {
  DummySource src(cfg, Device::cpu, seed, true);
  (void)ModelWeights::bind(cfg, src, with_mtp);
  return std::move(src.made());
}

int64_t dummy_weight_bytes(const ModelConfig& cfg, bool with_mtp) {
  int64_t total = 0;
  for (const DummyTensor& t : dummy_tensors(cfg, 0, with_mtp)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    total += n * int64_t(dtype_size(t.dtype));
  }
  return total;
}

ModelWeights make_dummy_weights(const ModelConfig& cfg, Device device, uint64_t seed, bool with_mtp) {
  DummySource src(cfg, device, seed, false);
  return ModelWeights::bind(cfg, src, with_mtp);
}

std::shared_ptr<Model> make_dummy_model(const ModelConfig& cfg, Device device, uint64_t seed, bool with_mtp) {
  return std::make_shared<Model>(cfg, io::Checkpoint{}, make_dummy_weights(cfg, device, seed, with_mtp));
}

}  // namespace dsaserve::model
