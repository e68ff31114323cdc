#pragma once
// KernelOptions: every kernel choice a run can make (which MLA decode kernel, v5's order, which indexer
// score kernel and select path, the GEMM precision), one value built by the command line (src/cli's
// kernel_flags) or by a test or benchmark and passed down explicitly: to the backend that runs the
// model's operators (kernels/ops.h make_backend), from there into each kernel's params. Nothing below
// src/cli reads the environment or a process-wide switch for these.
//
// The selectors below turn a request (automatic unless forced) and the launch's shapes into the kernel
// that runs; they are plain functions of their inputs (tested on the CPU: tests/kernels/
// kernel_options_test.cpp), and the only place the defaults live. One section per operator folder of
// kernels/cuda (each folder's README.md names its selector).
#include <cstdint>
#include <string>
#include <string_view>

namespace dsaserve::kernels {

// ---- attention/: MLA decode (kernels/cuda/attention) ----

// Sparse MLA decode (kernels/cuda/attention/sm90_mla_decode*.cu). v2: head groups of 16, keys split across
// warps; v5: 64 heads, Q K^T and P V by wgmma, the two warpgroups taking turns on whole key tiles (over an
// FP8 cache fed by a third warpgroup that dequantises: sm90_mla_decode_v5_fp8.cu). v1, v3 and v4 were
// removed as slower everywhere (v4, 64 heads with the warpgroups splitting each tile: FP8 top-2048 266 us at
// batch 128 against v5's 151; bf16 188 against 133). v6: 64 heads, 64-key blocks taken in pairs by the two
// warpgroups, fed by a producer warpgroup that copies bf16 rows or dequantises FP8 ones on their way
// (sm90_mla_decode_v6.cu).
enum class MlaDecodeKernel : int { automatic = 0, v2 = 2, v5 = 5, v6 = 6 };
// v5's order of the P V product and the next tile's reload: early (dense rows) or late (sparse rows).
enum class MlaV5Order : int { automatic = 0, early = 1, late = 2 };

// The head count up to which the MLA decode runs v2 by default (its 16-head blocks); above it v5. The
// attention-form rule of model/model.h keeps its narrow / wide head classes at the same cutoff.
inline constexpr int64_t kMlaDecodeNarrowMaxHeads = 16;

// The MLA decode kernel a launch runs. `requested` unless automatic; automatic: v2 for <= 16 heads and for
// one or two rows at more heads (`rows` < 0: unknown, taken as many; measured on the H200,
// attention_gpu_bench mla: batch 1 16.3 vs v5's 22.1 us, batch 2 19.3 vs 24.2), otherwise v6 over a bf16
// cache (`fp8_cache` false) and v5 over an FP8 one. Measured on an H100 (2026-12-07, one run, top-2048, batch
// 128, HBM-resident cache): bf16 at 64 heads v6 137.1 vs v5 144.4 us, at 128 heads 193.1 vs 239.9, 2,048
// prefill-sized rows 1,783 vs 1,973, dense (context 2,048) 131.1 vs 134.1; FP8 at 64 heads v6 160.0 vs v5
// 142.8 (v6's producer loads raw rows into registers one half block ahead, which leaves the gather's latency
// exposed; v5 keeps two tiles in flight by cp.async), dense FP8 157.6 vs 131.3. Never returns automatic.
MlaDecodeKernel select_mla_decode_kernel(MlaDecodeKernel requested, int64_t heads, int64_t rows,
                                         bool fp8_cache = false);
// Whether the kernel select_mla_decode_kernel picks is v2 (the split-count model, mla_decode_splits).
inline bool mla_decode_uses_v2(MlaDecodeKernel requested, int64_t heads, int64_t rows) {
  return select_mla_decode_kernel(requested, heads, rows) == MlaDecodeKernel::v2;
}
// Whether an MLA launch over an FP8 latent cache first copies its sequences' rows to bf16
// (attention/mla_decode_params.h launch_mla_cache_bf16_copy) and runs the bf16 kernel (v6 by default, or a
// requested v5) on the copy instead of on the FP8 rows: when the rows would run v5 or v6, and the copy is
// small beside the keys the rows read (copy_tokens x 16 <= rows x keys_per_row: prefill chunks, never a
// decode or verify batch) and at most kMlaBf16CopyMaxTokens tokens. Measured on the H200 (4K-token GLM-5.3
// prefill, top-2048, 64 heads): v4 on FP8 rows 7.6 ms a layer, v5 on bf16 rows 3.6 ms; the copy of 4K rows
// is a few microseconds; v5 on FP8 rows is 1.13x v5 on bf16 rows at batch 128 (151 vs 133 us), so the copy
// still pays where it is small. SGLang does the same for FlashMLA's sparse prefill (bf16 only).
inline constexpr int64_t kMlaBf16CopyMaxTokens = int64_t(1) << 18;  // 288 MiB of bf16 rows
bool select_mla_fp8_bf16_copy(MlaDecodeKernel requested, int64_t heads, int64_t rows, int64_t copy_tokens,
                              int64_t keys_per_row);
// v5's order: `requested` unless automatic; automatic: early for dense rows (no selection: contiguous
// pages, 109 us early vs 117 late at batch 128), late for sparse rows (top-2048: 133 us late vs 151).
bool select_mla_v5_early(MlaV5Order requested, bool sparse);

// ---- attention/: MHA-form attention (kernels/cuda/attention ops_attention.cpp attention_mha) ----

// plain: the CUDA-core kernel of attention.cu (any dims, selections); mma: the tensor-core dense prefill
// kernel (sm90_mha_prefill.cu: bf16 mma.sync, no selection, the GLM-5.x and DeepSeek-V3.2 head dims).
enum class MhaKernel : int { automatic = 0, plain = 1, mma = 2 };
// The MHA kernel a call runs (never automatic): mma when `requested` is automatic or mma, the call has no
// key selection (`dense`: every row attends 0 .. start_pos + t) and its dims have an mma configuration
// (`mma_fits`: kernels/cuda/attention/mha_prefill_params.h mha_prefill_supported); otherwise plain.
MhaKernel select_mha_kernel(MhaKernel requested, bool dense, bool mma_fits);

// ---- indexer/: lightning indexer scores and top-k select (kernels/cuda/indexer) ----

// The indexer's score kernel (kernels/cuda/indexer/sm90_indexer_topk.cu). v2: 3-8 stages, XOR-swizzled shared
// rows, FP8 keys via f16 MMAs; v3: v2 with FP8 keys through wgmma (bf16 keys: v2).
enum class IndexerScoreKernel : int { automatic = 0, v2 = 2, v3 = 3 };
// How the indexer's select runs (every path gives the same output); see indexer_topk_params.h.
enum class IndexerSelectPath : int { automatic = 0, row = 1, passes = 2, cooperative = 3, row_fused = 4 };

// The indexer score kernel a launch runs: `requested` unless automatic (v3 by measurement on the H200,
// batch 64 x 128K: FP8 350 us against v2's 363; bf16 527 us both); v3 over bf16 keys is v2.
IndexerScoreKernel select_indexer_score_kernel(IndexerScoreKernel requested, bool fp8_keys);

// (The select path's rule needs the device's cooperative-launch capacity: indexer_select_path,
// kernels/cuda/indexer/indexer_topk_params.h.)

// ---- moe/: routed experts (kernels/cuda/moe) ----

// The routed experts' path (kernels/cuda/moe/ops_moe.cpp; select_moe_path decides). device: the
// device-grouped CUDA-core kernels (weights dequantised in registers, f32 activations); device_fp8: the
// device-grouped tensor-core kernels of the FP8 recipe (FP8 experts with 128x128 blocks, fast GEMMs:
// mma.sync for decode-sized groups, wgmma for prefill-sized ones); host: the host-grouped per-expert
// cuBLASLt GEMMs. automatic picks device_fp8 for such experts at every size (capture included), else
// device or host by shape; capture never runs host.
enum class MoePath : int32_t { automatic = 0, device = 1, host = 2, device_fp8 = 3 };

// What a moe_experts call is: `pairs` (token, expert) pairs over `experts` experts of width hidden x inter;
// fp8_grouped: the experts fit the FP8 tensor-core kernels (FP8 weights, 128x128 blocks, hidden and inter
// multiples of 128) and the GEMMs run in fast precision; capturing: the op stream is being captured.
struct MoeCall {
  int64_t pairs = 0, experts = 1, hidden = 0, inter = 0;
  bool fp8_grouped = false, capturing = false;
};
// The path a call takes (never automatic): `requested` unless automatic, with two rules: device_fp8 where
// the experts do not fit it runs device, and host while capturing runs device. automatic: device_fp8 for
// experts it fits (FP8, 128x128 blocks, the fast GEMM precision: fp8_grouped) at every size; otherwise
// device while capturing, for at most 2 rows per expert on average or while the expert GEMMs are small
// (6 x pairs x hidden x inter <= 3e8 x experts), else host.
MoePath select_moe_path(MoePath requested, const MoeCall& c);

// ---- gemm/: linears (kernels/cuda/gemm) ----

// fast: the production GEMM recipes (bf16 / FP8 tensor cores); fp32: every weight dequantised once to
// f32 and multiplied in f32 (a reference-precision mode for accuracy checks; several times the memory).
enum class GemmPrecision : int { fast = 0, fp32 = 1 };
// The FP8 linears' small-T path (kernels/cuda/gemm/gemm_small_params.h): token counts up to
// KernelOptions::gemm_fp8_small_max_tokens (0..kGemmFp8SmallMaxTokens; 0 sends every FP8 GEMM to
// cuBLASLt) run the weight-streaming kernel. The default, 8, is the measured crossover on the H200
// (gemm_small_params.h).
inline constexpr int64_t kGemmFp8SmallMaxTokens = 32;
inline constexpr int64_t kGemmFp8SmallDefaultTokens = 8;
// The FP8 grouped experts' wgmma form (kernels/cuda/moe/moe_params.h MoeFp8GemmParams::tail_rows): a group's
// last pass takes up to KernelOptions::moe_fp8_tail_rows rows past 128 (0..kMoeFp8TailRowsMax). Default 32,
// measured on an H100 (2026-12-07, ops_gpu_bench moe, one GLM-5.3 layer, 32 vs 0): T = 4,096 5,766 vs 7,155
// us, 16,384 21,761 vs 22,969, 1,024 / 2,048 within 1%; the 8-layer slice's FP8-KV prefill of 4,096
// tokens 87.44 vs 90.36 ms.
inline constexpr int kMoeFp8TailRowsMax = 32;
inline constexpr int kMoeFp8TailRowsDefault = 32;
// The narrow bf16 linears' two-term recipe (routers, indexer heads: kernels/cuda/gemm/gemm.h): from
// KernelOptions::gemm_split_fused_min_tokens tokens on, linear_multi's narrow parts (the indexer's wk +
// weights_proj) run in one launch of the fused kernel (kernels/cuda/gemm/gemm_f32act_params.h: the f32 rows
// split into hi + lo as they are staged, x read once for both) instead of a split pass and two cuBLASLt GEMMs
// per weight (0: never). Measured on the H100 (ops_gpu_bench prefill): 196 vs 308 us at 4,096 tokens, 580 vs
// 1,010 at 16,384, 137 vs 112 at 1,024 (so not below); one weight alone (router_gate) keeps the split pass +
// cuBLASLt at every size (199 vs 168 us at 4,096).
inline constexpr int64_t kGemmSplitFusedDefaultTokens = 4096;
// MLA's absorbed v projection (absorb_v, and absorb_v_fp8 with o_proj's FP8 copy) from
// KernelOptions::absorb_fused_min_tokens tokens on runs the same kernel over the heads (the f32 activations
// rounded to bf16 as they are staged) instead of a conversion pass and cuBLASLt's strided batch (0: never).
// Measured on the H100 (fused vs old): absorb_v + o_proj's quantisation 507 vs 607 us at 4,096 tokens, 148 vs
// 165 at 1,024, 36 vs 38 at 128, slower below (32 vs 20 at 32 tokens); 256 keeps every decode and verify
// batch (T <= 128) on the old path. absorb_q stays on cuBLASLt at every size (fused 448 vs cuBLASLt 365 us at
// 4,096).
inline constexpr int64_t kAbsorbFusedDefaultTokens = 256;
// MLA's absorbed projections (absorb_q, absorb_v) at up to KernelOptions::absorb_small_max_tokens tokens
// (0: never; at most kAbsorbSmallMaxTokens) run one weight-streaming launch over every head
// (kernels/cuda/attention/absorb_params.h: bf16 weights times the f32 activations as they are, f32
// accumulation) instead of a conversion pass and cuBLASLt's strided batch: one launch instead of two at
// decode, the 12.6 / 16.8 MB of W_UK / W_UV (64 heads) read once. Measured on an H100 (2026-12-08,
// ops_gpu_bench fuse, cuBLASLt / small-T us): absorb_q 5.6 / 4.4 at one token, 5.6 / 5.5 at two, 5.7 / 7.8 at
// four; absorb_v 6.1 / 6.3 at one, 6.2 / 11.6 at two (the kernel's tokens share one weight pass but not its
// lanes). The GLM-5.3 slice's decode (realwidth_gpu_bench, FP8 KV, 4K): batch 1 2.985 -> 2.970 ms with 1 or
// 8, batch 2 and 4 +0.9% / +2.0% with 2 / 4, batch 8 +4.1% with 8. Off (0) all the same: its sums (f32
// activations) are not cuBLASLt's (bf16-rounded activations), so with 1 a batch-1 decode step (one token,
// this kernel) and the MTP verify of the same request (4 rows, cuBLASLt) computed different logits, and
// greedy speculation left plain greedy at a near-tie (the GPU test CudaSpecGraph.RealdimsGreedyWith
// SpeculationAndGraphsEqualsPlainGreedy, one request alone: 11 of 24 tokens equal, on an H100 2026-12-08; a
// batch of three, on cuBLASLt in both steps, 72 of 72). 0.5% of a batch-1 step is not worth that.
inline constexpr int64_t kAbsorbSmallMaxTokensLimit = 8;
inline constexpr int64_t kAbsorbSmallDefaultTokens = 0;
// SiLU-mul writes its output's FP8 copy for an FP8 down projection (silu_mul_fp8, kernels/cuda/elementwise/
// silu_fp8_params.h: bit for bit the quantisation pass it replaces) when KernelOptions::silu_mul_fp8_copy;
// false: silu_mul and the down projection's own quantisation pass (the old path). Measured on the H100
// (ops_gpu_bench prefill, one launch vs two): 1.25-1.31x at 1,024-16,384 tokens; at one token 4.8 vs 9.0 us
// for the shared expert's 2,048 columns and 12.0 vs 8.4 us for the dense MLP's 12,288 (a net gain per step
// of the GLM-5.3 slice: five MoE layers, three dense).
inline constexpr bool kSiluMulFp8CopyDefault = true;
// Wide bf16 linears (more than kSplitMaxRows output features: the LM head of an FP8 model, every linear of a
// bf16 one) at T <= kBf16SmallMaxTokens tokens run the narrow linears' weight-streaming small-T kernel (the
// two-term recipe: x split into bf16 hi + lo, ~16 mantissa bits of x kept) when
// KernelOptions::gemm_bf16_small_wide; false: x rounded to bf16 once and cuBLASLt. The LM head [154,880 x
// 6,144] is a third of a batch-1 decode step's weight bytes on the GLM-5.3 slice. Measured on the H100
// (realwidth_gpu_bench, FP8 KV, context 4K, batch 1): 3.206 ms a step on vs 3.163 off; ops_gpu_bench lmhead:
// cuBLASLt / small-T 660 / 666 us at one token, 666 / 694 at 8, 662 / 1,003 at 32. Off until it wins.
inline constexpr bool kGemmBf16SmallWideDefault = false;
// linear_multi's parts on the small-T kernels in one launch when KernelOptions::gemm_small_fuse: the FP8
// parts (q_a + kv_a, a dense MLP's or the shared expert's gate + up) and the narrow bf16 parts of the
// two-term recipe (the indexer's wk + weights_proj). The parts' 128-row slices form one grid under one K
// split chosen for all of them (one wave instead of one per part; kv_a alone splits its 48 K blocks 48
// ways). Each part's outputs are the same sums in another order of the split's partial sums (within the
// kernels' tolerance of separate calls, not bit for bit). false: a launch per part. Measured on an H100
// (2026-12-08, ops_gpu_bench fuse, separate / fused us at T = 1 and 8): q_a + kv_a 12.9 / 9.3 and 18.0
// / 11.6, the shared expert's gate + up 14.1 / 10.9 and 17.4 / 12.5, a dense MLP's 65.3 / 60.1 and 69.5
// / 63.2, the indexer's wk + weights_proj 12.1 / 6.2 and 16.6 / 8.3; the GLM-5.3 slice's decode
// (realwidth_gpu_bench --small-fuse 0,1, FP8 KV, 4K) batch 1 3.063 -> 2.985 ms, 8 6.574 -> 6.455, 32 13.605
// -> 13.529. On.
inline constexpr bool kGemmSmallFuseDefault = true;
// (No selector function: gemm_linear, kernels/cuda/gemm/gemm.cpp, picks the recipe from the precision and
// the weight's dtype and shape, falling back where cuBLASLt has no plan.)

// ---- launches: programmatic dependent launch (every folder) ----

// Whether the kernels of a step are launched as programmatic dependents of the kernel before them in the
// stream (PDL, sm_90: cudaLaunchKernelEx with cudaLaunchAttributeProgrammaticStreamSerialization; under
// CUDA-graph capture a programmatic edge): a kernel's CTAs become resident and run their prologue (and the
// weight-streaming GEMMs their first weight reads, as L2 prefetches) while the previous kernel drains, then
// wait (griddepcontrol.wait) for it before touching anything it wrote or reads. Off: ordinary launches
// (the kernels' waits are no-ops). Which kernels take it: kernels/cuda/common/pdl.cuh and the README.
// On: measured three times on H100s (realwidth_gpu_bench --pdl off,on, the GLM-5.3 slice, 4K, graphs; the
// H200 not lent), batch 1 -1.9 to -2.3% (2026-12-08, with the fused small-T pairs: FP8 KV 2.970 -> 2.915 ms,
// bf16 2.944 -> 2.889), batch 8 -0.6 to -1.0%, batch 32 and 128 within +-0.1% that day (+0.5-0.7% at 128 on
// 2026-12-06), prefill within 0.5%; every operator bit-identical on and off (CudaPdl* tests).
inline constexpr bool kPdlDefault = true;

// ---- the options value ----

struct KernelOptions {
  MlaDecodeKernel mla_decode = MlaDecodeKernel::automatic;
  MlaV5Order mla_v5_order = MlaV5Order::automatic;
  // v5's grid with more than 64 heads: true (the default) puts a row's head groups of 64 on neighbouring
  // blocks of grid.x, so that they run in the same wave and the later ones find the row's keys in L2; false
  // puts them on grid.y (each group's blocks a wave apart, every key read twice from HBM). Same values bit
  // for bit (MlaDecodeParams::head_groups_adjacent). Measured at 128 heads, batch 128 (H100,
  // attention_gpu_bench): FP8 cache 304.7 -> 289.5 us, bf16 277.1 -> 243.7. No flag (tests and
  // attention_gpu_bench set it).
  bool mla_head_groups_adjacent = true;
  IndexerScoreKernel indexer_score = IndexerScoreKernel::automatic;
  IndexerSelectPath indexer_select = IndexerSelectPath::automatic;
  GemmPrecision gemm = GemmPrecision::fast;
  int64_t gemm_fp8_small_max_tokens = kGemmFp8SmallDefaultTokens;      // 0..kGemmFp8SmallMaxTokens
  int64_t gemm_split_fused_min_tokens = kGemmSplitFusedDefaultTokens;  // 0: never
  int64_t absorb_fused_min_tokens = kAbsorbFusedDefaultTokens;         // 0: never
  int64_t absorb_small_max_tokens = kAbsorbSmallDefaultTokens;         // 0..kAbsorbSmallMaxTokensLimit
  bool silu_mul_fp8_copy = kSiluMulFp8CopyDefault;
  bool gemm_bf16_small_wide = kGemmBf16SmallWideDefault;
  bool gemm_small_fuse = kGemmSmallFuseDefault;
  MoePath moe = MoePath::automatic;
  // The FP8 grouped experts' packed rows per pass (kernels/cuda/moe/moe_params.h MoeFp8GemmParams::tile_rows:
  // 8 the mma.sync form, 128 the wgmma form); 0: by the shapes (moe_fp8_tile_rows).
  int moe_fp8_tile_rows = 0;
  // The wgmma form: rows a group's last pass takes past 128 (MoeFp8GemmParams::tail_rows: 0 .. 32), as a
  // second wgmma on the same weight tile, instead of a pass of their own that streams the weights again.
  // The sums are the same bit for bit either way.
  int moe_fp8_tail_rows = kMoeFp8TailRowsDefault;
  MhaKernel mha = MhaKernel::automatic;
  bool pdl = kPdlDefault;  // programmatic dependent launches (above)
  bool operator==(const KernelOptions&) const = default;
};

// ---- names (command-line flags, benchmark output) ----
// "auto", "v2", "v5" / "auto", "early", "late" / "auto", "v2", "v3" / "auto", "row", "row_fused",
// "passes", "coop" / "fast", "fp32" / "auto", "device", "device_fp8", "host" / "auto", "plain", "mma" /
// "off", "on" (pdl_name).
std::string_view name(MlaDecodeKernel k);
std::string_view name(MlaV5Order o);
std::string_view name(IndexerScoreKernel k);
std::string_view name(IndexerSelectPath p);
std::string_view name(GemmPrecision p);
std::string_view name(MoePath p);
std::string_view name(MhaKernel k);
std::string_view pdl_name(bool pdl);
// The inverses; throw dsaserve::Error naming `flag` and the accepted values for anything else.
MlaDecodeKernel parse_mla_decode_kernel(std::string_view s, std::string_view flag);
MlaV5Order parse_mla_v5_order(std::string_view s, std::string_view flag);
IndexerScoreKernel parse_indexer_score_kernel(std::string_view s, std::string_view flag);
IndexerSelectPath parse_indexer_select_path(std::string_view s, std::string_view flag);
GemmPrecision parse_gemm_precision(std::string_view s, std::string_view flag);
MoePath parse_moe_path(std::string_view s, std::string_view flag);
MhaKernel parse_mha_kernel(std::string_view s, std::string_view flag);
bool parse_pdl(std::string_view s, std::string_view flag);  // "on" / "off"
// Throws dsaserve::Error naming `flag` unless 0 <= t <= kAbsorbSmallMaxTokensLimit; returns t.
int64_t check_absorb_small_max_tokens(int64_t t, std::string_view flag);
// Throws dsaserve::Error naming `flag` unless 0 <= t <= kGemmFp8SmallMaxTokens; returns t.
int64_t check_gemm_fp8_small_max_tokens(int64_t t, std::string_view flag);
// Throws dsaserve::Error naming `flag` unless 0 <= r <= kMoeFp8TailRowsMax; returns r.
int check_moe_fp8_tail_rows(int r, std::string_view flag);
// "mla_decode=auto mla_v5_order=auto indexer_score=auto indexer_select=auto gemm=fast
// gemm_fp8_small_max_tokens=8 moe=auto" (and " moe_fp8_tile_rows=N", " moe_fp8_tail_rows=N", " mha=K",
// " pdl=on|off",
// " gemm_split_fused_min_tokens=N", " absorb_fused_min_tokens=N", " silu_mul_fp8_copy=0|1",
// " gemm_bf16_small_wide=0|1", " gemm_small_fuse=0|1", " absorb_small_max_tokens=N" when not the
// defaults).
std::string describe(const KernelOptions& o);

}  // namespace dsaserve::kernels
