#include "cli/kernel_flags.h"

#include "core/error.h"

namespace dsaserve::cli {

kernels::KernelOptions KernelFlags::options() const {
  kernels::KernelOptions o;
  o.mla_decode = kernels::parse_mla_decode_kernel(mla_decode, "--mla-decode-kernel");
  o.mla_v5_order = kernels::parse_mla_v5_order(mla_v5_order, "--mla-v5-order");
  o.indexer_score = kernels::parse_indexer_score_kernel(indexer_score, "--indexer-score-kernel");
  o.indexer_select = kernels::parse_indexer_select_path(indexer_select, "--indexer-select-path");
  o.gemm = kernels::parse_gemm_precision(gemm, "--gemm-precision");
  o.gemm_fp8_small_max_tokens =
      kernels::check_gemm_fp8_small_max_tokens(gemm_fp8_small_max_tokens, "--gemm-fp8-small-max-tokens");
  o.moe = kernels::parse_moe_path(moe, "--moe-path");
  DSA_CHECK(moe_fp8_tile_rows == 0 || moe_fp8_tile_rows == 8 || moe_fp8_tile_rows == 128,
            "--moe-fp8-tile-rows {}: expected 0 (by the shapes), 8 (mma.sync) or 128 (wgmma)",
            moe_fp8_tile_rows);
  o.moe_fp8_tile_rows = moe_fp8_tile_rows;
  o.moe_fp8_tail_rows = kernels::check_moe_fp8_tail_rows(moe_fp8_tail_rows, "--moe-fp8-tail-rows");
  o.mha = kernels::parse_mha_kernel(mha, "--mha-kernel");
  o.pdl = kernels::parse_pdl(pdl, "--pdl");
  return o;
}

std::shared_ptr<KernelFlags> add_kernel_flags(CLI::App& sub) {
  auto f = std::make_shared<KernelFlags>();
  const std::string g = "Kernels (--device cuda; the defaults are the measured choices)";
  sub.add_option("--mla-decode-kernel", f->mla_decode,
                 "MLA decode kernel: auto (v2 at <= 16 heads or <= 2 rows, else v6 over bf16 caches and v5 "
                 "over FP8), v2, v5, v6")
      ->group(g)
      ->capture_default_str();
  sub.add_option("--mla-v5-order", f->mla_v5_order,
                 "MLA decode v5 order: auto (early dense, late sparse), early, late")
      ->group(g)
      ->capture_default_str();
  sub.add_option("--indexer-score-kernel", f->indexer_score,
                 "DSA indexer score kernel: auto (v3; bf16 keys run v2), v2, v3")
      ->group(g)
      ->capture_default_str();
  sub.add_option(
         "--indexer-select-path", f->indexer_select,
         "DSA indexer top-k select: auto, row, row_fused (one CTA per row), passes, coop (split rows)")
      ->group(g)
      ->capture_default_str();
  sub.add_option("--gemm-precision", f->gemm,
                 "GEMMs: fast (bf16 / FP8 tensor cores) or fp32 (reference precision)")
      ->group(g)
      ->capture_default_str();
  sub.add_option("--gemm-fp8-small-max-tokens", f->gemm_fp8_small_max_tokens,
                 "FP8 linears of up to this many tokens (0-32) run the weight-streaming small-T kernel, "
                 "more tokens cuBLASLt (0: always cuBLASLt)")
      ->group(g)
      ->capture_default_str();
  sub.add_option("--moe-path", f->moe,
                 "routed experts: auto, device_fp8 (grouped FP8 tensor-core kernels), device (grouped "
                 "CUDA-core kernels) or host (per-expert GEMMs)")
      ->group(g)
      ->capture_default_str();
  sub.add_option("--moe-fp8-tile-rows", f->moe_fp8_tile_rows,
                 "FP8 grouped experts: packed rows per pass, 0 (by the shapes), 8 (mma.sync) or 128 (wgmma)")
      ->group(g)
      ->capture_default_str();
  sub.add_option(
         "--moe-fp8-tail-rows", f->moe_fp8_tail_rows,
         "FP8 grouped experts, wgmma form: rows past 128 that a group's last pass takes (0..32) instead "
         "of streaming the expert's weights again for them (same sums bit for bit)")
      ->group(g)
      ->capture_default_str();
  sub.add_option("--mha-kernel", f->mha,
                 "MHA-form attention: auto (mma for dense prefill chunks at the GLM-5.x / DeepSeek-V3.2 head "
                 "dims, else plain), plain (CUDA cores), mma (tensor cores where it applies)")
      ->group(g)
      ->capture_default_str();
  sub.add_option("--pdl", f->pdl,
                 "programmatic dependent launch of the step's kernels (each kernel's launch and prologue "
                 "overlap the previous kernel's tail; CUDA graphs keep it as programmatic edges): off, on")
      ->group(g)
      ->capture_default_str();
  return f;
}

}  // namespace dsaserve::cli
