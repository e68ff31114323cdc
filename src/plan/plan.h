#pragma once
// The deployment bill: for a model config and an SGLang-style layout (--tp, --ep-size, --attn-dp-size, ...),
// the operator chain of every layer kind with shapes, FLOPs and bytes on one rank, every collective with
// its group and message size, the memory each GPU holds, and a roofline time per step. The cost model and
// where it departs from the reference article are described in docs/plan.md.
//
// Records are keyed for a later comparison with a trace: (step, pass, layer kind, op name) is unique, op
// names are stable strings (docs/plan.md lists them), and one record stands for every layer of its kind.
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "dist/layout.h"
#include "model/config.h"

namespace dsaserve::plan {

enum class KvDtype : uint8_t { bf16, fp8_e4m3 };
enum class A2aBackend : uint8_t { none, deepep };  // SGLang --moe-a2a-backend

// The machine ceilings the roofline divides by. Defaults: ../shared/docs/GPU.md (measured on the H200).
struct Hardware {
  std::string name;
  double memory_bytes = 0;              // per GPU, as torch reports it (mem_fraction_static applies to this)
  double hbm_bytes_per_s = 0;           // bytes read + written per second
  double bf16_flops_per_s = 0;          // dense GEMM, bf16
  double fp8_flops_per_s = 0;           // GEMM with FP8 128x128 block-scaled weights
  double interconnect_bytes_per_s = 0;  // per GPU, one direction (NVLink on one node)
  double collective_latency_s = 0;      // fixed cost per collective launch
  static Hardware named(const std::string& gpu);  // "h200"; throws dsaserve::Error otherwise
};

// The deployment, in SGLang's flag names. tp is the number of GPUs of the serving group.
struct Deployment {
  int64_t tp = 1;                 // --tp
  int64_t ep_size = 1;            // --ep-size: experts split over ep ranks, each expert over tp/ep
  int64_t attn_dp_size = 1;       // --attn-dp-size: attention replicated over dp groups of tp/dp ranks
  int64_t moe_dense_tp_size = 0;  // --moe-dense-tp-size: 1 (dense MLPs replicated) or tp; 0 means tp
  A2aBackend moe_a2a_backend = A2aBackend::none;
  KvDtype kv_cache_dtype = KvDtype::bf16;
  int64_t speculative_num_draft_tokens = 0;  // 0: no MTP; N >= 2: N - 1 draft steps, verify N tokens
  int64_t batch = 1;                         // concurrent decoding requests in the whole deployment
  int64_t context = 4096;                    // tokens of context per decoding request
  int64_t prefill_tokens = 0;                // one request's prompt; 0 means `context`
  int64_t chunked_prefill_size = 8192;       // -1: no chunking
  double mem_fraction_static = 0.8;
  bool dsa_topk_broadcast = false;  // SGLANG_DSA_TOPK_BROADCAST: rank 0's top-k broadcast in attn TP
  // DeepEP's FP8 dispatch on FP8 models; false: SGLANG_DEEPEP_BF16_DISPATCH (--deepep-bf16-dispatch).
  bool deepep_fp8_dispatch = true;
  double accept_length = 1.0;  // output tokens per request per decode step (MTP acceptance)

  // The layout's group arithmetic is dist::ParallelLayout's (the ranks run what the plan prices).
  dist::ParallelLayout layout() const { return {tp, ep_size, attn_dp_size, moe_dense_tp_size}; }
  int64_t attn_tp() const { return layout().attn_tp(); }
  int64_t moe_tp() const { return layout().moe_tp(); }
  int64_t dense_tp() const { return layout().dense_tp(); }
  int64_t prefill() const { return prefill_tokens > 0 ? prefill_tokens : context; }
  int64_t chunk() const { return chunked_prefill_size > 0 ? chunked_prefill_size : prefill(); }
  // Throws dsaserve::Error naming the flag at fault (divisibility, ranges, unsupported combinations).
  void validate(const model::ModelConfig& c) const;
};

enum class OpKind : uint8_t {
  gemm,
  bmm,
  attention,
  indexer,
  norm,
  elementwise,
  embedding,
  cache_write,
  topk
};
enum class Precision : uint8_t { fp8, bf16, none };  // the ceiling the op's FLOPs are divided by

// One operator on one rank, for one layer of its kind (summed over prefill chunks).
struct Op {
  std::string name;  // stable: "qkv_a_proj", "sparse_mla", "experts_down", ... (docs/plan.md)
  OpKind kind = OpKind::elementwise;
  Precision precision = Precision::none;
  std::string shape;  // e.g. "[4, 6144] x [2624, 6144]^T"
  double flops = 0;
  double weight_bytes = 0;  // weights read from HBM
  double act_read_bytes = 0, act_write_bytes = 0;
  double kv_read_bytes = 0, kv_write_bytes = 0;  // MLA latent cache and indexer K cache
  double compute_s = 0, memory_s = 0;            // FLOPs / ceiling, bytes / HBM bandwidth
  double bytes() const {
    return weight_bytes + act_read_bytes + act_write_bytes + kv_read_bytes + kv_write_bytes;
  }
  double time_s() const { return compute_s > memory_s ? compute_s : memory_s; }
};

enum class CollKind : uint8_t { all_reduce, all_gather, reduce_scatter, dispatch, combine, broadcast };

// One collective on one rank. `bytes` follows the article's convention: the tensor each rank holds
// (all-reduce), the gathered output (all-gather), the input (reduce-scatter), what this rank sends
// (dispatch/combine, payload only: the activations; a dispatch's FP8 scales and routing in scale_bytes and
// meta_bytes; ep_dispatch_layout: the pair counts, one i64 per rank) or the broadcast tensor. wire_bytes
// is what this rank sends on the interconnect (ring: 2(n-1)/n, (n-1)/n; all-to-all: the remote share of
// bytes + scale_bytes + meta_bytes).
struct Collective {
  std::string name;  // stable: "attn_tp_all_reduce", "dp_all_gather", "ep_dispatch", ...
  CollKind kind = CollKind::all_reduce;
  std::string group;  // dist::to_string(GroupKind): "attn_tp", "world" (SGLang's TP group), "ep"
  int64_t group_size = 1;
  std::string after;       // the op it follows ("" = before the first op)
  int64_t count = 1;       // times per layer of its kind per pass (prefill: chunks)
  double bytes = 0;        // per occurrence
  double scale_bytes = 0;  // FP8 scales that travel with a dispatch, per occurrence
  double meta_bytes = 0;   // the routing that travels with a dispatch (expert i32 + weight f32 a pair)
  bool article = true;     // in the article's bill (false: DeepEP's layout exchange, which it leaves out)
  // false: in the article's bill only, not run (DP attention's gather / scatter around a DeepEP MoE
  // layer: DeepEP dispatches each rank's own rows, as SGLang and dsaserve do); counted in
  // article_bytes_per_output_token and nowhere else (no wire bytes, no time, not a traced collective).
  bool runs = true;
  double wire_bytes = 0;  // per occurrence
  double time_s = 0;      // per occurrence: latency + wire / bandwidth
};

// All layers of one kind ("dense.full", "moe.shared", "mtp", ...) in one pass.
struct LayerKindPlan {
  std::string name;
  std::vector<int64_t> layers;  // layer indices (the MTP layer: num_hidden_layers + i)
  std::vector<Op> ops;          // in execution order
  std::vector<Collective> collectives;
};

// One forward pass over the model (or the MTP layer), repeated `repeat` times per step.
struct Pass {
  std::string name;  // "prefill", "prefill_draft_extend", "decode", "draft", "verify", "draft_extend"
  int64_t repeat = 1;
  bool mtp = false;            // runs the MTP layer instead of the decoder stack
  int64_t requests_local = 0;  // requests on this rank's attention (DP) group
  int64_t tokens_local = 0;    // tokens this rank attends for (per chunk for prefill)
  int64_t tokens_global = 0;   // tokens of the whole deployment in this pass (per chunk)
  int64_t chunks = 1;
  std::vector<Op> head_ops;  // embedding
  std::vector<Collective> head_collectives;
  std::vector<LayerKindPlan> layer_kinds;
  std::vector<Op> tail_ops;  // final norm, lm_head, sampling
  std::vector<Collective> tail_collectives;
};

struct StepTotals {
  double flops = 0, weight_bytes = 0, act_bytes = 0, kv_read_bytes = 0, kv_write_bytes = 0;
  double compute_floor_s = 0;  // sum over ops of FLOPs / ceiling
  double memory_floor_s = 0;   // sum over ops of bytes / HBM
  double op_time_s = 0;        // sum over ops of max(compute, memory)
  int64_t collectives = 0;     // collective calls per step on one rank
  double comm_bytes = 0;       // message bytes per rank (the `bytes` convention)
  double comm_wire_bytes = 0;  // bytes this rank sends
  double comm_s = 0;
  double time_s = 0;                          // op_time_s + comm_s (no overlap assumed)
  double output_tokens = 0;                   // per step, whole deployment
  double wire_bytes_per_output_token = 0;     // all ranks' wire bytes / output tokens
  double article_bytes_per_output_token = 0;  // the article's sum (see docs/plan.md)
};

struct StepPlan {
  std::string name;  // "prefill" | "decode"
  std::vector<Pass> passes;
  StepTotals totals;
};

struct WeightGroup {
  std::string name;    // "embed_tokens", "attention.qkv_a_proj", "routed_experts", ...
  int64_t params = 0;  // whole model
  int64_t shards = 1;  // 1: replicated on every GPU
  std::string sharded_over;
  double bytes_per_gpu = 0;  // including FP8 block scales
};

struct MemoryPlan {
  std::vector<WeightGroup> weights;
  double weights_sharded_bytes = 0, weights_replicated_bytes = 0, weights_bytes = 0;
  int64_t kv_values_per_token = 0;  // kv_cache_dim x layers (44,928 for GLM-5.3)
  double kv_bytes_per_token_layer = 0;
  double kv_bytes_per_token = 0;          // decoder layers
  double indexer_bytes_per_token = 0;     // full indexer layers
  double mtp_bytes_per_token = 0;         // the MTP layer's KV + indexer (with speculative decoding)
  double cache_bytes_per_token = 0;       // all of the above
  double budget_bytes = 0;                // memory x mem_fraction_static
  double kv_pool_bytes = 0;               // budget - weights
  int64_t kv_tokens_fit = 0;              // per GPU (pages of 64)
  int64_t max_requests_per_dp_group = 0;  // at --context (each GPU of the group holds the same KV)
  int64_t max_requests = 0;               // deployment (x attention DP groups)
  bool batch_fits = false;
  double routed_expert_bytes = 0;  // per GPU
  double expert_read_floor_s = 0;  // all local routed experts once / HBM (the article's floor)
  double weight_read_floor_s = 0;  // all resident weights once / HBM
};

struct Plan {
  std::string model_type;
  Deployment deployment;
  Hardware hardware;
  MemoryPlan memory;
  StepPlan prefill, decode;
  std::vector<std::string> notes;  // warnings: batch does not fit, ...
};

Plan build_plan(const model::ModelConfig& c, const Deployment& d, const Hardware& hw);

nlohmann::json to_json(const Plan& p);
std::string to_text(const Plan& p);

const char* to_string(OpKind k);
const char* to_string(Precision p);
const char* to_string(CollKind k);
const char* to_string(KvDtype k);
const char* to_string(A2aBackend b);

// Memory alone (used by build_plan; exposed for tests).
MemoryPlan plan_memory(const model::ModelConfig& c, const Deployment& d, const Hardware& hw);

}  // namespace dsaserve::plan
