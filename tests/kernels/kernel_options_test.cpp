// The kernel selectors of kernels/kernel_options.h: which MLA decode kernel, v5 order and indexer score
// kernel a launch runs for every request and shape class (the defaults as measured on the H200, the FP8
// prefill copy, the 16-head cutoff), and the flag names.
#include "kernels/kernel_options.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.h"

namespace dsaserve::kernels {
namespace {

using K = MlaDecodeKernel;

TEST(KernelSelect, MlaDecodeDefaults) {
  // <= 16 heads: v2 whatever the rows (unknown, one, many).
  for (int64_t nh : {8, 16})
    for (int64_t rows : {-1, 1, 2, 3, 4096})
      EXPECT_EQ(select_mla_decode_kernel(K::automatic, nh, rows), K::v2);
  // Above 16 heads: v2 for one or two rows (its 16-head blocks fill more SMs), otherwise v6 over a bf16
  // cache and v5 over an FP8 one.
  for (int64_t rows : {1, 2})
    for (bool fp8 : {false, true})
      EXPECT_EQ(select_mla_decode_kernel(K::automatic, 64, rows, fp8), K::v2) << rows;
  for (int64_t rows : {3, 32, 4096}) {
    EXPECT_EQ(select_mla_decode_kernel(K::automatic, 64, rows), K::v6);
    EXPECT_EQ(select_mla_decode_kernel(K::automatic, 64, rows, true), K::v5);
  }
  EXPECT_EQ(select_mla_decode_kernel(K::automatic, 64, -1), K::v6);  // rows unknown: taken as many
  EXPECT_EQ(select_mla_decode_kernel(K::automatic, 17, 128), K::v6);
  EXPECT_EQ(select_mla_decode_kernel(K::automatic, 128, 128, true), K::v5);
  for (int64_t rows : {-1, 1, 4096}) EXPECT_EQ(select_mla_decode_kernel(K::automatic, 16, rows, true), K::v2);
  EXPECT_EQ(kMlaDecodeNarrowMaxHeads, 16);
}

// FP8 prefill chunks read a bf16 copy with v6 (or a requested v5); decode and verify batches (copy large
// beside their keys), v2 shapes, a forced v2 and oversized copies stay on the FP8 rows.
TEST(KernelSelect, MlaFp8Bf16CopyOnlyForPrefillSizedRows) {
  EXPECT_TRUE(select_mla_fp8_bf16_copy(K::automatic, 64, 4096, 4096, 2048));    // 4K prefill chunk
  EXPECT_TRUE(select_mla_fp8_bf16_copy(K::v5, 64, 4096, 131072, 2048));         // 4K chunk at 128K context
  EXPECT_TRUE(select_mla_fp8_bf16_copy(K::v6, 64, 4096, 4096, 2048));           // v6 reads the copy too
  EXPECT_TRUE(select_mla_fp8_bf16_copy(K::v6, 16, 4096, 4096, 2048));           // requested: any heads
  EXPECT_FALSE(select_mla_fp8_bf16_copy(K::automatic, 64, 512, 131072, 2048));  // copy > keys / 16
  EXPECT_FALSE(select_mla_fp8_bf16_copy(K::automatic, 64, 128, 128 * 4096, 2048));    // decode batch
  EXPECT_FALSE(select_mla_fp8_bf16_copy(K::automatic, 64, 32 * 6, 32 * 4096, 2048));  // verify batch
  EXPECT_FALSE(select_mla_fp8_bf16_copy(K::v2, 64, 4096, 4096, 2048));
  EXPECT_FALSE(select_mla_fp8_bf16_copy(K::automatic, 16, 4096, 4096, 2048));  // v2's head count
  EXPECT_FALSE(select_mla_fp8_bf16_copy(K::automatic, 64, 2, 1, 2048));        // v2's row count
  EXPECT_FALSE(select_mla_fp8_bf16_copy(K::automatic, 64, 1 << 20, kMlaBf16CopyMaxTokens + 1, 2048));
  EXPECT_TRUE(select_mla_fp8_bf16_copy(K::automatic, 64, 1 << 20, kMlaBf16CopyMaxTokens, 2048));
}

TEST(KernelSelect, MlaDecodeRequestWins) {
  for (K k : {K::v2, K::v5, K::v6})
    for (int64_t nh : {8, 16, 64})
      for (int64_t rows : {-1, 1, 2, 4096})
        for (bool fp8 : {false, true}) EXPECT_EQ(select_mla_decode_kernel(k, nh, rows, fp8), k);
  // The split model follows the same choice (v2 or not), with or without a request.
  EXPECT_TRUE(mla_decode_uses_v2(K::automatic, 16, 4096));
  EXPECT_TRUE(mla_decode_uses_v2(K::automatic, 64, 2));
  EXPECT_FALSE(mla_decode_uses_v2(K::automatic, 64, 3));
  EXPECT_FALSE(mla_decode_uses_v2(K::v5, 8, 1));
  EXPECT_TRUE(mla_decode_uses_v2(K::v2, 64, 4096));
  EXPECT_FALSE(mla_decode_uses_v2(K::v6, 8, 1));
}

TEST(KernelSelect, MlaV5Order) {
  EXPECT_TRUE(select_mla_v5_early(MlaV5Order::automatic, false));  // dense rows: early
  EXPECT_FALSE(select_mla_v5_early(MlaV5Order::automatic, true));  // sparse rows: late
  for (bool sparse : {false, true}) {
    EXPECT_TRUE(select_mla_v5_early(MlaV5Order::early, sparse));
    EXPECT_FALSE(select_mla_v5_early(MlaV5Order::late, sparse));
  }
}

TEST(KernelSelect, IndexerScore) {
  using S = IndexerScoreKernel;
  EXPECT_EQ(select_indexer_score_kernel(S::automatic, true), S::v3);
  EXPECT_EQ(select_indexer_score_kernel(S::automatic, false), S::v2);  // v3 with bf16 keys is v2
  EXPECT_EQ(select_indexer_score_kernel(S::v3, false), S::v2);
  EXPECT_EQ(select_indexer_score_kernel(S::v3, true), S::v3);
  EXPECT_EQ(select_indexer_score_kernel(S::v2, true), S::v2);
  EXPECT_EQ(select_indexer_score_kernel(S::v2, false), S::v2);
}

// GLM-5.3's routed experts: 256 of 6144 x 2048, top-8 (pairs = 8 x tokens).
MoeCall glm_call(int64_t tokens, bool fp8, bool capturing = false) {
  MoeCall c;
  c.pairs = 8 * tokens;
  c.experts = 256;
  c.hidden = 6144;
  c.inter = 2048;
  c.fp8_grouped = fp8;
  c.capturing = capturing;
  return c;
}

TEST(KernelSelect, MoePathAutomatic) {
  // FP8 experts (128x128 blocks): the tensor-core grouped kernels at every size, capture included.
  for (int64_t T : {1, 64, 96, 256, 4096}) {
    for (bool capturing : {false, true}) {
      EXPECT_EQ(select_moe_path(MoePath::automatic, glm_call(T, true, capturing)), MoePath::device_fp8) << T;
    }
  }
  // Other experts: the CUDA-core grouped kernels up to 2 rows per expert on average or while the GEMMs are
  // small, else the host path; capture: device.
  EXPECT_EQ(select_moe_path(MoePath::automatic, glm_call(1, false)), MoePath::device);
  EXPECT_EQ(select_moe_path(MoePath::automatic, glm_call(64, false)), MoePath::device);  // 2 rows
  EXPECT_EQ(select_moe_path(MoePath::automatic, glm_call(96, false)), MoePath::device);  // small GEMMs
  EXPECT_EQ(select_moe_path(MoePath::automatic, glm_call(256, false)), MoePath::host);
  EXPECT_EQ(select_moe_path(MoePath::automatic, glm_call(4096, false)), MoePath::host);
  EXPECT_EQ(select_moe_path(MoePath::automatic, glm_call(4096, false, true)), MoePath::device);
  // Narrow experts (realdims: 16 of 256 x 128, top-4) stay on the device path while their GEMMs are small.
  MoeCall narrow;
  narrow.experts = 16;
  narrow.hidden = 256;
  narrow.inter = 128;
  narrow.pairs = 4 * 300;  // 75 rows per expert
  EXPECT_EQ(select_moe_path(MoePath::automatic, narrow), MoePath::device);
  narrow.pairs = 4 * 100000;
  EXPECT_EQ(select_moe_path(MoePath::automatic, narrow), MoePath::host);
}

TEST(KernelSelect, MoePathRequests) {
  for (int64_t T : {1, 4096}) {
    for (bool capturing : {false, true}) {
      // device and device_fp8 run as asked (device_fp8 where the experts fit it, else device).
      EXPECT_EQ(select_moe_path(MoePath::device, glm_call(T, true, capturing)), MoePath::device);
      EXPECT_EQ(select_moe_path(MoePath::device_fp8, glm_call(T, true, capturing)), MoePath::device_fp8);
      EXPECT_EQ(select_moe_path(MoePath::device_fp8, glm_call(T, false, capturing)), MoePath::device);
    }
    // host runs as asked, except under capture (no host synchronisation there): device.
    EXPECT_EQ(select_moe_path(MoePath::host, glm_call(T, true)), MoePath::host);
    EXPECT_EQ(select_moe_path(MoePath::host, glm_call(T, true, true)), MoePath::device);
    EXPECT_EQ(select_moe_path(MoePath::host, glm_call(T, false, true)), MoePath::device);
  }
}

// The MHA form: tensor cores for dense chunks at the dims they have a configuration for, unless plain is
// asked for; selections and other dims always plain.
TEST(KernelSelect, MhaKernel) {
  for (MhaKernel k : {MhaKernel::automatic, MhaKernel::mma}) {
    EXPECT_EQ(select_mha_kernel(k, true, true), MhaKernel::mma);
    EXPECT_EQ(select_mha_kernel(k, false, true), MhaKernel::plain);
    EXPECT_EQ(select_mha_kernel(k, true, false), MhaKernel::plain);
  }
  EXPECT_EQ(select_mha_kernel(MhaKernel::plain, true, true), MhaKernel::plain);
}

TEST(KernelOptionsNames, RoundTripAndErrors) {
  for (K k : {K::automatic, K::v2, K::v5}) EXPECT_EQ(parse_mla_decode_kernel(name(k), "--f"), k);
  for (MlaV5Order o : {MlaV5Order::automatic, MlaV5Order::early, MlaV5Order::late})
    EXPECT_EQ(parse_mla_v5_order(name(o), "--f"), o);
  for (IndexerScoreKernel s : {IndexerScoreKernel::automatic, IndexerScoreKernel::v2, IndexerScoreKernel::v3})
    EXPECT_EQ(parse_indexer_score_kernel(name(s), "--f"), s);
  for (IndexerSelectPath p :
       {IndexerSelectPath::automatic, IndexerSelectPath::row, IndexerSelectPath::row_fused,
        IndexerSelectPath::passes, IndexerSelectPath::cooperative})
    EXPECT_EQ(parse_indexer_select_path(name(p), "--f"), p);
  for (GemmPrecision g : {GemmPrecision::fast, GemmPrecision::fp32})
    EXPECT_EQ(parse_gemm_precision(name(g), "--f"), g);
  for (MoePath m : {MoePath::automatic, MoePath::device, MoePath::device_fp8, MoePath::host})
    EXPECT_EQ(parse_moe_path(name(m), "--f"), m);
  for (MhaKernel k : {MhaKernel::automatic, MhaKernel::plain, MhaKernel::mma})
    EXPECT_EQ(parse_mha_kernel(name(k), "--f"), k);
  EXPECT_THROW(parse_mha_kernel("wgmma", "--mha-kernel"), Error);
  EXPECT_EQ(name(MoePath::device_fp8), "device_fp8");
  EXPECT_THROW(parse_moe_path("fp8", "--moe-path"), Error);
  // Removed kernels (MLA decode v1 / v3 / v4, indexer score v1) and unknown names are errors naming the flag.
  for (const char* bad : {"v1", "v3", "v4", "", "V5"}) {
    try {
      parse_mla_decode_kernel(bad, "--mla-decode-kernel");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--mla-decode-kernel"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("auto, v2, v5"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse_indexer_score_kernel("v1", "--indexer-score-kernel"), Error);
  EXPECT_EQ(describe(KernelOptions{}),
            "mla_decode=auto mla_v5_order=auto indexer_score=auto indexer_select=auto gemm=fast "
            "gemm_fp8_small_max_tokens=8 moe=auto");
  KernelOptions tiled;
  tiled.moe_fp8_tile_rows = 128;
  EXPECT_EQ(describe(tiled),
            "mla_decode=auto mla_v5_order=auto indexer_score=auto indexer_select=auto gemm=fast "
            "gemm_fp8_small_max_tokens=8 moe=auto moe_fp8_tile_rows=128");
  KernelOptions no_tail;
  no_tail.moe_fp8_tail_rows = 0;
  EXPECT_EQ(describe(no_tail),
            "mla_decode=auto mla_v5_order=auto indexer_score=auto indexer_select=auto gemm=fast "
            "gemm_fp8_small_max_tokens=8 moe=auto moe_fp8_tail_rows=0");
  EXPECT_EQ(check_moe_fp8_tail_rows(0, "--moe-fp8-tail-rows"), 0);
  EXPECT_EQ(check_moe_fp8_tail_rows(32, "--moe-fp8-tail-rows"), 32);
  for (int bad : {-1, 33, 128}) {
    try {
      check_moe_fp8_tail_rows(bad, "--moe-fp8-tail-rows");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--moe-fp8-tail-rows"), std::string::npos) << e.what();
    }
  }
  KernelOptions apart;
  apart.mla_head_groups_adjacent = false;
  EXPECT_EQ(describe(apart),
            "mla_decode=auto mla_v5_order=auto indexer_score=auto indexer_select=auto gemm=fast "
            "gemm_fp8_small_max_tokens=8 moe=auto mla_head_groups_adjacent=0");
  KernelOptions plain_mha;
  plain_mha.mha = MhaKernel::plain;
  EXPECT_EQ(describe(plain_mha),
            "mla_decode=auto mla_v5_order=auto indexer_score=auto indexer_select=auto gemm=fast "
            "gemm_fp8_small_max_tokens=8 moe=auto mha=plain");
  KernelOptions fused;
  fused.gemm_split_fused_min_tokens = 0;
  fused.absorb_fused_min_tokens = 1;
  EXPECT_EQ(describe(fused),
            "mla_decode=auto mla_v5_order=auto indexer_score=auto indexer_select=auto gemm=fast "
            "gemm_fp8_small_max_tokens=8 moe=auto gemm_split_fused_min_tokens=0 absorb_fused_min_tokens=1");
}
// The f32-activation kernel's token thresholds (kernels/cuda/gemm/gemm_f32act_params.h): defaults above every
// decode and verify batch of the CUDA graphs (T <= 128), so those keep their paths.
TEST(KernelOptions, FusedPrefillThresholdsLeaveDecodeAlone) {
  EXPECT_EQ(KernelOptions{}.gemm_split_fused_min_tokens, kGemmSplitFusedDefaultTokens);
  EXPECT_EQ(KernelOptions{}.absorb_fused_min_tokens, kAbsorbFusedDefaultTokens);
  EXPECT_GT(kGemmSplitFusedDefaultTokens, 128);
  EXPECT_GT(kAbsorbFusedDefaultTokens, 128);
  EXPECT_TRUE(KernelOptions{}.silu_mul_fp8_copy);
  KernelOptions old;
  old.silu_mul_fp8_copy = false;
  EXPECT_NE(describe(old).find(" silu_mul_fp8_copy=0"), std::string::npos) << describe(old);
  // Wide bf16 linears on the small-T kernel: off by default, named when on.
  EXPECT_FALSE(KernelOptions{}.gemm_bf16_small_wide);
  KernelOptions wide;
  wide.gemm_bf16_small_wide = true;
  EXPECT_NE(describe(wide).find(" gemm_bf16_small_wide=1"), std::string::npos) << describe(wide);
  EXPECT_EQ(describe(KernelOptions{}).find("gemm_bf16_small_wide"), std::string::npos);
  // linear_multi's FP8 parts in one small-T launch: named when not the default.
  KernelOptions fuse;
  fuse.gemm_small_fuse = !kGemmSmallFuseDefault;
  EXPECT_NE(describe(fuse).find(fmt::format(" gemm_small_fuse={}", fuse.gemm_small_fuse ? 1 : 0)),
            std::string::npos)
      << describe(fuse);
  EXPECT_EQ(describe(KernelOptions{}).find("gemm_small_fuse"), std::string::npos);
  // The absorbed projections' small-T kernel: a token limit in range, named when not the default.
  KernelOptions absorb;
  absorb.absorb_small_max_tokens = kAbsorbSmallDefaultTokens == 8 ? 4 : 8;
  EXPECT_NE(describe(absorb).find(fmt::format(" absorb_small_max_tokens={}", absorb.absorb_small_max_tokens)),
            std::string::npos)
      << describe(absorb);
  EXPECT_EQ(describe(KernelOptions{}).find("absorb_small_max_tokens"), std::string::npos);
  for (int64_t t : {int64_t(0), int64_t(1), kAbsorbSmallMaxTokensLimit})
    EXPECT_EQ(check_absorb_small_max_tokens(t, "--absorb-small-max-tokens"), t);
  for (int64_t t : {int64_t(-1), kAbsorbSmallMaxTokensLimit + 1})
    EXPECT_THROW(check_absorb_small_max_tokens(t, "--absorb-small-max-tokens"), Error);
}
// The FP8 small-T limit is a value of the options (no process-wide setter): 0..32, the default 8; anything
// else is an error naming the flag.
TEST(KernelOptions, Fp8SmallMaxTokensIsAnOptionInRange) {
  EXPECT_EQ(KernelOptions{}.gemm_fp8_small_max_tokens, kGemmFp8SmallDefaultTokens);
  EXPECT_EQ(kGemmFp8SmallDefaultTokens, 8);
  for (int64_t t : {int64_t(0), int64_t(1), int64_t(8), kGemmFp8SmallMaxTokens})
    EXPECT_EQ(check_gemm_fp8_small_max_tokens(t, "--gemm-fp8-small-max-tokens"), t);
  for (int64_t t : {int64_t(-1), kGemmFp8SmallMaxTokens + 1}) {
    try {
      check_gemm_fp8_small_max_tokens(t, "--gemm-fp8-small-max-tokens");
      ADD_FAILURE() << t;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--gemm-fp8-small-max-tokens"), std::string::npos) << e.what();
    }
  }
  KernelOptions a, b;
  b.gemm_fp8_small_max_tokens = 0;
  EXPECT_NE(a, b);
}

// Programmatic dependent launch (KernelOptions::pdl, --pdl on|off): on by default (measured), an
// option of the value like the others (two values differ by it), named "off" / "on" (anything else is an
// error naming the flag and the accepted values), and shown by describe() when not the default.
TEST(KernelOptions, PdlIsAnOptionOnByDefault) {
  EXPECT_TRUE(kPdlDefault);
  EXPECT_EQ(KernelOptions{}.pdl, kPdlDefault);
  for (bool v : {false, true}) EXPECT_EQ(parse_pdl(pdl_name(v), "--pdl"), v);
  EXPECT_EQ(pdl_name(true), "on");
  EXPECT_EQ(pdl_name(false), "off");
  for (const char* bad : {"", "ON", "true", "1", "yes"}) {
    try {
      parse_pdl(bad, "--pdl");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--pdl"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("off, on"), std::string::npos) << e.what();
    }
  }
  KernelOptions on;
  on.pdl = !kPdlDefault;
  EXPECT_NE(on, KernelOptions{});
  EXPECT_EQ(describe(on),
            "mla_decode=auto mla_v5_order=auto indexer_score=auto indexer_select=auto gemm=fast "
            "gemm_fp8_small_max_tokens=8 moe=auto pdl=" +
                std::string(pdl_name(!kPdlDefault)));
  EXPECT_EQ(describe(KernelOptions{}).find("pdl"), std::string::npos) << "the default is not printed";
}

}  // namespace
}  // namespace dsaserve::kernels
