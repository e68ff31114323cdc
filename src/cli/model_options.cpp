#include "cli/model_options.h"

namespace dsaserve::cli {

CLI::Option* add_model_options(CLI::App& sub, model::LoadSpec& spec, const std::string& names,
                               const std::string& help) {
  CLI::Option* m = sub.add_option(names, spec.model, help);
  sub.add_option("--load-format", spec.load_format,
                 "auto | safetensors: read the checkpoint; dummy: random weights at the config's full widths "
                 "(FP8 where its quantization_config says so), generated on the device, no checkpoint")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "safetensors", "dummy"}));
  sub.add_option(
      "--json-model-override-args", spec.override_args,
      "JSON object overriding config keys, e.g. '{\"num_hidden_layers\": 8}' (per-layer lists keep "
      "their first entries)");
  return m;
}

}  // namespace dsaserve::cli
