#pragma once
// The model flags every command that loads a model shares (serve, generate, score, inspect):
// `--model` (a folder, or a config file with --load-format dummy), `--load-format auto|safetensors|dummy`
// and `--json-model-override-args JSON` (SGLang's names; model/load.h).
#include <CLI/CLI.hpp>
#include <string>

#include "model/load.h"

namespace dsaserve::cli {

// Adds the three flags, writing into `spec`. `names`: the model flag's names ("--model" or
// "--model-path,--model").
CLI::Option* add_model_options(CLI::App& sub, model::LoadSpec& spec, const std::string& names = "--model",
                               const std::string& help =
                                   "model folder (config.json + safetensors), or with "
                                   "--load-format dummy a config file");

}  // namespace dsaserve::cli
