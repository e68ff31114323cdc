// Hardware ceilings, deployment validation and enum names.
#include <algorithm>

#include "core/error.h"
#include "plan/plan.h"

namespace dsaserve::plan {

Hardware Hardware::named(const std::string& gpu) {
  std::string g = gpu;
  std::transform(g.begin(), g.end(), g.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  if (g == "h200") {
    Hardware h;
    h.name = "h200";
    // torch.cuda.mem_get_info() total on the lent H200 (2026-11-29): 150,109,880,320 B (139.8 GiB;
    // nvidia-smi: 143,771 MiB). SGLang's mem_fraction_static is a fraction of this total.
    h.memory_bytes = 150109880320.0;
    h.hbm_bytes_per_s = 4.3e12;          // GPU.md: device-to-device copy, read + write
    h.bf16_flops_per_s = 797e12;         // GPU.md: bf16 dense GEMM 8192^3
    h.fp8_flops_per_s = 1200e12;         // GPU.md: cuBLASLt FP8 block-scaled, low end of 1,200-1,560
    h.interconnect_bytes_per_s = 900e9;  // NVLink 4 per GPU as the article quotes it; --interconnect-gbps
    h.collective_latency_s = 5e-6;       // the article's per-collective launch latency
    return h;
  }
  fail("plan: --gpu '{}' is not known (known: h200)", gpu);
}

void Deployment::validate(const model::ModelConfig& c) const {
  try {
    layout().validate();
  } catch (const Error& e) {
    fail("plan: {}", e.what());
  }
  DSA_CHECK(c.num_attention_heads % attn_tp() == 0,
            "plan: num_attention_heads {} is not divisible by the attention TP size {} (--tp {} / "
            "--attn-dp-size {})",
            c.num_attention_heads, attn_tp(), tp, attn_dp_size);
  const int64_t block = c.fp8.enabled ? c.fp8.block_n : 1;
  auto check_split = [&](const char* what, int64_t size, int64_t parts, const char* flag) {
    DSA_CHECK(size % parts == 0, "plan: {} {} is not divisible by {} ({})", what, size, parts, flag);
    DSA_CHECK((size / parts) % block == 0,
              "plan: {} {} split {} ways gives {}, not a multiple of the FP8 weight block {} ({})", what,
              size, parts, size / parts, block, flag);
  };
  const bool has_dense =
      std::count(c.mlp_layer_types.begin(), c.mlp_layer_types.end(), model::MlpType::dense) > 0;
  const bool has_moe =
      std::count(c.mlp_layer_types.begin(), c.mlp_layer_types.end(), model::MlpType::moe) > 0 ||
      c.num_nextn_predict_layers > 0;
  if (has_dense) check_split("intermediate_size", c.intermediate_size, dense_tp(), "dense MLP TP size");
  if (has_moe) {
    DSA_CHECK(c.n_routed_experts % ep_size == 0, "plan: n_routed_experts {} is not divisible by --ep-size {}",
              c.n_routed_experts, ep_size);
    check_split("moe_intermediate_size", c.moe_intermediate_size, moe_tp(), "MoE TP size = --tp / --ep-size");
    if (c.n_shared_experts > 0) {
      check_split("shared expert intermediate size", c.moe_intermediate_size * c.n_shared_experts, moe_tp(),
                  "MoE TP size = --tp / --ep-size");
    }
  }
  if (moe_a2a_backend == A2aBackend::deepep) {
    DSA_CHECK(
        ep_size > 1 && ep_size == tp,
        "plan: --moe-a2a-backend deepep needs --ep-size equal to --tp and > 1 (got --ep-size {}, --tp {})",
        ep_size, tp);
  }
  DSA_CHECK(speculative_num_draft_tokens == 0 || speculative_num_draft_tokens >= 2,
            "plan: --speculative-num-draft-tokens must be 0 (off) or >= 2, got {}",
            speculative_num_draft_tokens);
  DSA_CHECK(speculative_num_draft_tokens == 0 || c.num_nextn_predict_layers >= 1,
            "plan: --speculative-num-draft-tokens {} needs an MTP layer, but num_nextn_predict_layers is 0",
            speculative_num_draft_tokens);
  DSA_CHECK(batch >= 1, "plan: --batch must be >= 1, got {}", batch);
  DSA_CHECK(context >= 1, "plan: --context must be >= 1, got {}", context);
  DSA_CHECK(prefill_tokens >= 0, "plan: --prefill-tokens must be >= 1, got {}", prefill_tokens);
  DSA_CHECK(chunked_prefill_size == -1 || chunked_prefill_size >= 1,
            "plan: --chunked-prefill-size must be -1 (no chunking) or >= 1, got {}", chunked_prefill_size);
  if (c.max_position_embeddings > 0) {
    DSA_CHECK(context <= c.max_position_embeddings,
              "plan: --context {} exceeds the model's max_position_embeddings {}", context,
              c.max_position_embeddings);
    DSA_CHECK(prefill() <= c.max_position_embeddings,
              "plan: --prefill-tokens {} exceeds the model's max_position_embeddings {}", prefill(),
              c.max_position_embeddings);
  }
  DSA_CHECK(mem_fraction_static > 0 && mem_fraction_static <= 1,
            "plan: --mem-fraction-static must be in (0, 1], got {}", mem_fraction_static);
  const double max_accept = double(std::max<int64_t>(1, speculative_num_draft_tokens));
  DSA_CHECK(accept_length >= 1 && accept_length <= max_accept,
            "plan: --accept-length must be in [1, {}] (1 without speculative decoding), got {}", max_accept,
            accept_length);
}

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::gemm: return "gemm";
    case OpKind::bmm: return "bmm";
    case OpKind::attention: return "attention";
    case OpKind::indexer: return "indexer";
    case OpKind::norm: return "norm";
    case OpKind::elementwise: return "elementwise";
    case OpKind::embedding: return "embedding";
    case OpKind::cache_write: return "cache_write";
    case OpKind::topk: return "topk";
  }
  return "?";
}

const char* to_string(Precision p) {
  switch (p) {
    case Precision::fp8: return "fp8";
    case Precision::bf16: return "bf16";
    case Precision::none: return "-";
  }
  return "?";
}

const char* to_string(CollKind k) {
  switch (k) {
    case CollKind::all_reduce: return "all-reduce";
    case CollKind::all_gather: return "all-gather";
    case CollKind::reduce_scatter: return "reduce-scatter";
    case CollKind::dispatch: return "dispatch";
    case CollKind::combine: return "combine";
    case CollKind::broadcast: return "broadcast";
  }
  return "?";
}

const char* to_string(KvDtype k) { return k == KvDtype::bf16 ? "bf16" : "fp8_e4m3"; }
const char* to_string(A2aBackend b) { return b == A2aBackend::none ? "none" : "deepep"; }

}  // namespace dsaserve::plan
