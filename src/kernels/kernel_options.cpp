#include "kernels/kernel_options.h"

#include <array>
#include <utility>

#include "core/error.h"

namespace dsaserve::kernels {

MlaDecodeKernel select_mla_decode_kernel(MlaDecodeKernel requested, int64_t heads, int64_t rows,
                                         bool fp8_cache) {
  if (requested != MlaDecodeKernel::automatic) return requested;
  if (heads <= kMlaDecodeNarrowMaxHeads || (rows >= 0 && rows <= 2)) return MlaDecodeKernel::v2;
  return fp8_cache ? MlaDecodeKernel::v5 : MlaDecodeKernel::v6;
}

bool select_mla_fp8_bf16_copy(MlaDecodeKernel requested, int64_t heads, int64_t rows, int64_t copy_tokens,
                              int64_t keys_per_row) {
  const MlaDecodeKernel k = select_mla_decode_kernel(requested, heads, rows);
  if (k != MlaDecodeKernel::v5 && k != MlaDecodeKernel::v6) return false;
  if (copy_tokens <= 0 || copy_tokens > kMlaBf16CopyMaxTokens || rows <= 0 || keys_per_row <= 0) return false;
  return copy_tokens <= rows * keys_per_row / 16;
}

bool select_mla_v5_early(MlaV5Order requested, bool sparse) {
  if (requested == MlaV5Order::automatic) return !sparse;
  return requested == MlaV5Order::early;
}

MhaKernel select_mha_kernel(MhaKernel requested, bool dense, bool mma_fits) {
  if (requested == MhaKernel::plain || !dense || !mma_fits) return MhaKernel::plain;
  return MhaKernel::mma;
}

IndexerScoreKernel select_indexer_score_kernel(IndexerScoreKernel requested, bool fp8_keys) {
  const IndexerScoreKernel k =
      requested == IndexerScoreKernel::automatic ? IndexerScoreKernel::v3 : requested;
  return k == IndexerScoreKernel::v3 && !fp8_keys ? IndexerScoreKernel::v2 : k;  // bf16 keys: v3 is v2
}

MoePath select_moe_path(MoePath requested, const MoeCall& c) {
  switch (requested) {
    case MoePath::device: return MoePath::device;
    case MoePath::device_fp8: return c.fp8_grouped ? MoePath::device_fp8 : MoePath::device;
    case MoePath::host: return c.capturing ? MoePath::device : MoePath::host;
    case MoePath::automatic: break;
  }
  // FP8 experts with 128x128 blocks: the tensor-core grouped kernels at every size (measured on the H200,
  // ops_gpu_bench moe, one GLM-5.3 layer: T = 1 111 us against the CUDA-core kernels' 127; T = 32 1.51 ms
  // against 2.82 (0.92 of the weight-streaming floor); T = 128 2.68 ms against 9.44 and the host path's
  // 10.3; T = 4096 16.4 ms against the host path's 19.9).
  if (c.fp8_grouped) return MoePath::device_fp8;
  if (c.capturing) return MoePath::device;
  // The CUDA-core kernels multiply at ~6 TFLOP/s: they win while an expert's GEMMs cost less than the
  // host path's ~50 us of launches for it (~0.3 GFLOP; narrow models such as realdims stay on them).
  // Measured on the H200 at GLM-5.3 widths: 1 row per expert 2.9 ms against 6.1 ms on the host path,
  // 8 rows 27.1 ms against 11.4 ms.
  const int64_t E = c.experts > 0 ? c.experts : 1;
  const bool small = 6.0 * double(c.pairs) * double(c.hidden) * double(c.inter) <= 3e8 * double(E);
  return c.pairs <= 2 * E || small ? MoePath::device : MoePath::host;
}

namespace {

template <typename E, size_t N>
using Names = std::array<std::pair<E, std::string_view>, N>;

constexpr Names<MlaDecodeKernel, 4> kMla{{{MlaDecodeKernel::automatic, "auto"},
                                          {MlaDecodeKernel::v2, "v2"},
                                          {MlaDecodeKernel::v5, "v5"},
                                          {MlaDecodeKernel::v6, "v6"}}};
constexpr Names<MlaV5Order, 3> kOrder{
    {{MlaV5Order::automatic, "auto"}, {MlaV5Order::early, "early"}, {MlaV5Order::late, "late"}}};
constexpr Names<IndexerScoreKernel, 3> kScore{{{IndexerScoreKernel::automatic, "auto"},
                                               {IndexerScoreKernel::v2, "v2"},
                                               {IndexerScoreKernel::v3, "v3"}}};
constexpr Names<IndexerSelectPath, 5> kSelect{{{IndexerSelectPath::automatic, "auto"},
                                               {IndexerSelectPath::row, "row"},
                                               {IndexerSelectPath::row_fused, "row_fused"},
                                               {IndexerSelectPath::passes, "passes"},
                                               {IndexerSelectPath::cooperative, "coop"}}};
constexpr Names<GemmPrecision, 2> kGemm{{{GemmPrecision::fast, "fast"}, {GemmPrecision::fp32, "fp32"}}};
constexpr Names<MoePath, 4> kMoe{{{MoePath::automatic, "auto"},
                                  {MoePath::device, "device"},
                                  {MoePath::device_fp8, "device_fp8"},
                                  {MoePath::host, "host"}}};
constexpr Names<bool, 2> kPdl{{{false, "off"}, {true, "on"}}};
constexpr Names<MhaKernel, 3> kMha{
    {{MhaKernel::automatic, "auto"}, {MhaKernel::plain, "plain"}, {MhaKernel::mma, "mma"}}};

template <typename E, size_t N>
std::string_view name_of(const Names<E, N>& names, E e) {
  for (const auto& [v, n] : names)
    if (v == e) return n;
  return "?";
}

template <typename E, size_t N>
E parse_of(const Names<E, N>& names, std::string_view s, std::string_view flag) {
  std::string accepted;
  for (const auto& [v, n] : names) {
    if (n == s) return v;
    accepted += accepted.empty() ? "" : ", ";
    accepted += n;
  }
  fail("{}: unknown value '{}' (accepted: {})", flag, s, accepted);
}

}  // namespace

std::string_view name(MlaDecodeKernel k) { return name_of(kMla, k); }
std::string_view name(MlaV5Order o) { return name_of(kOrder, o); }
std::string_view name(IndexerScoreKernel k) { return name_of(kScore, k); }
std::string_view name(IndexerSelectPath p) { return name_of(kSelect, p); }
std::string_view name(GemmPrecision p) { return name_of(kGemm, p); }
std::string_view name(MoePath p) { return name_of(kMoe, p); }
std::string_view name(MhaKernel k) { return name_of(kMha, k); }
std::string_view pdl_name(bool pdl) { return name_of(kPdl, pdl); }

MlaDecodeKernel parse_mla_decode_kernel(std::string_view s, std::string_view flag) {
  return parse_of(kMla, s, flag);
}
MlaV5Order parse_mla_v5_order(std::string_view s, std::string_view flag) { return parse_of(kOrder, s, flag); }
IndexerScoreKernel parse_indexer_score_kernel(std::string_view s, std::string_view flag) {
  return parse_of(kScore, s, flag);
}
IndexerSelectPath parse_indexer_select_path(std::string_view s, std::string_view flag) {
  return parse_of(kSelect, s, flag);
}
GemmPrecision parse_gemm_precision(std::string_view s, std::string_view flag) {
  return parse_of(kGemm, s, flag);
}
MoePath parse_moe_path(std::string_view s, std::string_view flag) { return parse_of(kMoe, s, flag); }
MhaKernel parse_mha_kernel(std::string_view s, std::string_view flag) { return parse_of(kMha, s, flag); }
bool parse_pdl(std::string_view s, std::string_view flag) { return parse_of(kPdl, s, flag); }

int64_t check_absorb_small_max_tokens(int64_t t, std::string_view flag) {
  DSA_CHECK(t >= 0 && t <= kAbsorbSmallMaxTokensLimit,
            "{}: the absorbed projections' small-T kernel takes 0..{} tokens, got {}", flag,
            kAbsorbSmallMaxTokensLimit, t);
  return t;
}

int64_t check_gemm_fp8_small_max_tokens(int64_t t, std::string_view flag) {
  DSA_CHECK(t >= 0 && t <= kGemmFp8SmallMaxTokens, "{}: the FP8 small-T GEMM takes 0..{} tokens, got {}",
            flag, kGemmFp8SmallMaxTokens, t);
  return t;
}

int check_moe_fp8_tail_rows(int r, std::string_view flag) {
  DSA_CHECK(r >= 0 && r <= kMoeFp8TailRowsMax, "{}: the rows past 128 a pass takes are 0..{}, got {}", flag,
            kMoeFp8TailRowsMax, r);
  return r;
}

std::string describe(const KernelOptions& o) {
  return fmt::format(
             "mla_decode={} mla_v5_order={} indexer_score={} indexer_select={} gemm={} "
             "gemm_fp8_small_max_tokens={} "
             "moe={}",
             name(o.mla_decode), name(o.mla_v5_order), name(o.indexer_score), name(o.indexer_select),
             name(o.gemm), o.gemm_fp8_small_max_tokens, name(o.moe)) +
         (o.moe_fp8_tile_rows != 0 ? fmt::format(" moe_fp8_tile_rows={}", o.moe_fp8_tile_rows) : "") +
         (o.moe_fp8_tail_rows != kMoeFp8TailRowsDefault
              ? fmt::format(" moe_fp8_tail_rows={}", o.moe_fp8_tail_rows)
              : "") +
         (!o.mla_head_groups_adjacent ? " mla_head_groups_adjacent=0" : "") +
         (o.mha != MhaKernel::automatic ? fmt::format(" mha={}", name(o.mha)) : "") +
         (o.pdl != kPdlDefault ? fmt::format(" pdl={}", pdl_name(o.pdl)) : "") +
         (o.gemm_split_fused_min_tokens != kGemmSplitFusedDefaultTokens
              ? fmt::format(" gemm_split_fused_min_tokens={}", o.gemm_split_fused_min_tokens)
              : "") +
         (o.absorb_fused_min_tokens != kAbsorbFusedDefaultTokens
              ? fmt::format(" absorb_fused_min_tokens={}", o.absorb_fused_min_tokens)
              : "") +
         (o.silu_mul_fp8_copy != kSiluMulFp8CopyDefault
              ? fmt::format(" silu_mul_fp8_copy={}", o.silu_mul_fp8_copy ? 1 : 0)
              : "") +
         (o.gemm_bf16_small_wide != kGemmBf16SmallWideDefault
              ? fmt::format(" gemm_bf16_small_wide={}", o.gemm_bf16_small_wide ? 1 : 0)
              : "") +
         (o.gemm_small_fuse != kGemmSmallFuseDefault
              ? fmt::format(" gemm_small_fuse={}", o.gemm_small_fuse ? 1 : 0)
              : "") +
         (o.absorb_small_max_tokens != kAbsorbSmallDefaultTokens
              ? fmt::format(" absorb_small_max_tokens={}", o.absorb_small_max_tokens)
              : "");
}

}  // namespace dsaserve::kernels
