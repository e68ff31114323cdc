#pragma once
// The kernel-choice flags shared by serve, generate and score: one call adds them to a subcommand, and the
// returned holder builds the kernels::KernelOptions value the command passes down (runtime::model_on_device).
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "kernels/kernel_options.h"

namespace dsaserve::cli {

struct KernelFlags {
  std::string mla_decode = "auto", mla_v5_order = "auto", indexer_score = "auto", indexer_select = "auto",
              gemm = "fast", moe = "auto", mha = "auto";
  std::string pdl{kernels::pdl_name(kernels::kPdlDefault)};
  int moe_fp8_tile_rows = 0;
  int moe_fp8_tail_rows = kernels::kMoeFp8TailRowsDefault;
  int64_t gemm_fp8_small_max_tokens = kernels::kGemmFp8SmallDefaultTokens;
  // The parsed value; throws dsaserve::Error naming the flag for an unknown name.
  kernels::KernelOptions options() const;
};

// Adds --mla-decode-kernel, --mla-v5-order, --indexer-score-kernel, --indexer-select-path,
// --gemm-precision, --gemm-fp8-small-max-tokens, --moe-path, --moe-fp8-tile-rows, --mha-kernel and --pdl
// (all in the "Kernels" group).
std::shared_ptr<KernelFlags> add_kernel_flags(CLI::App& sub);

}  // namespace dsaserve::cli
