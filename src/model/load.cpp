#include "model/load.h"

#include <filesystem>

#include "core/error.h"
#include "model/dummy_weights.h"
#include "model/model.h"

namespace dsaserve::model {

namespace {
void check_spec(const LoadSpec& s) {
  DSA_CHECK(s.load_format == "auto" || s.load_format == "safetensors" || s.load_format == "dummy",
            "--load-format '{}': expected auto, safetensors or dummy", s.load_format);
  DSA_CHECK(!s.model.empty(), "--model is required");
  DSA_CHECK(s.dummy() || std::filesystem::is_directory(s.model),
            "--model {}: a checkpoint is a folder (config.json + safetensors); a config file alone needs "
            "--load-format dummy",
            s.model);
}
}  // namespace

ModelConfig load_config(const LoadSpec& spec) {
  check_spec(spec);
  return ModelConfig::load(spec.model, spec.override_args);
}

std::shared_ptr<Model> load_model(const LoadSpec& spec, Device device, bool with_mtp) {
  ModelConfig cfg = load_config(spec);
  if (spec.dummy()) return make_dummy_model(cfg, device, spec.dummy_seed, with_mtp);
  io::Checkpoint ckpt = io::Checkpoint::open(spec.model);
  ModelWeights w = ModelWeights::bind(cfg, ckpt, with_mtp);
  return std::make_shared<Model>(std::move(cfg), std::move(ckpt), std::move(w));
}

}  // namespace dsaserve::model
