#pragma once
// The speculative-decoding flags shared by generate and serve (SGLang's names): --speculative-algorithm
// EAGLE|NEXTN, --speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens (all in
// the "Speculative decoding" group). The command validates the value against the model
// (runtime::SpeculativeConfig::validate names the bad flag).
#include <CLI/CLI.hpp>

#include "runtime/spec/spec_config.h"

namespace dsaserve::cli {

void add_spec_flags(CLI::App& sub, runtime::SpeculativeConfig& cfg);

}  // namespace dsaserve::cli
