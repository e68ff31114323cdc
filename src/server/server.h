#pragma once
// The OpenAI-compatible HTTP server (Boost.Beast, asynchronous, one I/O thread; no thread per
// connection) in front of one runtime::Engine:
//   POST /v1/chat/completions, POST /v1/completions (SSE streaming or not), GET /v1/models,
//   GET /health, GET /metrics (Prometheus text).
// run_server() loads the model and tokenizer, starts the engine thread, serves until SIGTERM/SIGINT
// (then stops accepting, lets in-flight requests finish for up to shutdown_grace_s, and returns 0).
#include <cstdint>
#include <string>

#include "kernels/kernel_options.h"
#include "model/load.h"
#include "runtime/engine/engine.h"
#include "trace/trace.h"

namespace dsaserve::server {

struct ServerConfig {
  // model.model: a model folder, "builtin" (the built-in random-weight model), or with load_format dummy
  // a config file; model.load_format / override_args: --load-format, --json-model-override-args.
  model::LoadSpec model;
  std::string tokenizer_path;      // a folder / tokenizer.json, "builtin:bytes"; empty: the model folder's
  std::string chat_template_path;  // a Jinja file overriding the tokenizer's chat template
  std::string served_model_name;   // empty: "builtin" or the model folder's name
  std::string host = "127.0.0.1";
  int port = 30000;  // 0: any free port (printed at start)
  std::string api_key;
  // SGLang's names: --reasoning-parser deepseek-r1 | deepseek-v3 | glm45 | qwen3 (all split
  // <think>...</think>);
  // --tool-call-parser glm45 | glm47 | deepseekv3 | deepseekv31 | deepseekv32 (or the chat module's names).
  std::string reasoning_parser;
  std::string tool_call_parser;  // non-empty: /v1/* needs "Authorization: Bearer <key>"
  // engine.kv_pages: > 0 as given; 0: from mem_fraction_static; < 0 (the CLI's default): 512 on the CPU,
  // on CUDA the device memory free after the weights and warm-up less the activation workspace a step
  // can hold (runtime/engine/memory_plan.h) and a reserve.
  runtime::EngineConfig engine;
  // With attention DP (engine.ranks, --attn-dp-size > 1): how the front routes requests to the DP groups
  // (--load-balance-method round_robin | shortest_queue; runtime/ranks/front.h).
  std::string load_balance_method = "round_robin";
  // > 0 (with kv_pages <= 0): the KV pool gets (fraction of RAM - weights) on the CPU, (fraction of the
  // free device memory after the weights - the activation workspace estimate) on CUDA.
  double mem_fraction_static = 0;
  std::string device = "cpu";           // cpu | cuda (runtime/engine/device.h)
  std::string sampling_device = "cpu";  // cpu | gpu (gpu: needs device cuda; engine.sample_on_device)
  std::string kv_cache_dtype = "auto";  // auto | bf16 | fp8_e4m3 | f32 (auto: bf16 on CUDA, f32 on CPU)
  kernels::KernelOptions kernels;       // the model's kernel choices (cli/kernel_flags.h)
  int64_t context_length = 0;           // 0: the model's max_position_embeddings
  int64_t max_prompt_tokens = 0;        // 0: context_length - 1
  int64_t max_body_bytes = 8 << 20;
  int64_t max_queued_requests = 1024;  // beyond running + this many: 503
  int64_t max_n = 16;
  double read_timeout_s = 60;  // to receive one request
  double shutdown_grace_s = 30;
  uint64_t builtin_seed = 0;
  // With engine.trace_dir: events kept between two trace flushes (the rest are dropped and counted).
  int64_t trace_max_events = 1000000;
};

// Blocks until shutdown; returns the process exit status. Throws dsaserve::Error on bad setup.
int run_server(const ServerConfig& cfg);

// --trace-dir: what a rank's trace files add, its "plan_summary" (plan/trace_summary.h: the model's
// measured op spans beside the plan's for the same batches; with cfg.engine.ranks the collectives beside
// those of the deployment that ran).
trace::Recorder::Annotator trace_plan_annotator(const ServerConfig& cfg, const model::ModelConfig& mc);

}  // namespace dsaserve::server
