#pragma once
// Where a command's model comes from (serve, generate, score, inspect and the benches):
// `--model PATH --load-format auto|safetensors|dummy --json-model-override-args JSON`, as SGLang spells
// them. PATH is a model folder (config.json and, unless dummy, its safetensors checkpoint) or, with
// --load-format dummy, a config file itself.
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "model/config.h"

namespace dsaserve::model {

class Model;

struct LoadSpec {
  std::string model;                 // folder or (dummy) config file
  std::string load_format = "auto";  // auto (= safetensors) | safetensors | dummy (model/dummy_weights.h)
  std::string override_args;         // --json-model-override-args: a JSON object, empty for none
  uint64_t dummy_seed = 0;           // the dummy weights' seed
  bool dummy() const { return load_format == "dummy"; }
};

// The config with the overrides applied. Throws on an unknown load format, or a config file given
// without --load-format dummy.
ModelConfig load_config(const LoadSpec& spec);
// The model: a checkpoint bound on the host (its weights mapped; runtime/engine/device.h uploads them),
// or dummy weights generated on `device` directly. MTP layers only when with_mtp.
std::shared_ptr<Model> load_model(const LoadSpec& spec, Device device, bool with_mtp);

}  // namespace dsaserve::model
