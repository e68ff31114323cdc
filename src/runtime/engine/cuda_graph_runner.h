#pragma once
// CudaGraphRunner: one pass's steps through captured CUDA graphs (serve/generate --cuda-graph-max-bs N,
// --disable-cuda-graph). A batch of B requests replays the graph of its key (cuda_graph_plan.h: the
// smallest batch bucket >= B, the context bucket of its longest request): the batch is packed on the host
// (padding requests on a scratch KV page), uploaded with one asynchronous copy from pinned memory into
// the graph's static inputs, the graph launched on the legacy stream, and the first B x tokens logits (and
// hidden) rows copied out. The pass (GraphPass): decode steps (the engine's ModelRunner), or with
// speculative decoding the verify pass (steps + 1 rows per request, every row's logits and hidden state)
// or the MTP layer's one-token draft steps (their input hidden states copied into a static buffer first;
// runtime/engine/cuda_graph_spec.h holds those two). Prefills, mixed steps and every batch run() declines
// stay eager (Model::forward / forward_mtp).
//
// Graphs are captured at start-up for every batch bucket at the smallest context bucket (capture_all),
// and lazily, with a log line, the first time a key is met. Each capture follows one eager run of the
// same shapes (so lazily created device data exists first). A capture that fails (an operator on the
// path is not capturable) turns graphs off with a warning; later steps run eagerly.
#include <cstdint>
#include <memory>
#include <optional>

#include "core/tensor.h"
#include "model/model.h"
#include "runtime/engine/cuda_graph_plan.h"

namespace dsaserve::runtime {

struct CudaGraphStats {
  int64_t graphs = 0;          // captured (live) graphs
  int64_t replays = 0;         // steps that replayed one
  double capture_seconds = 0;  // eager pre-runs, captures and instantiations so far
  bool disabled = false;       // turned off (not eligible, or a capture failed)
};

class CudaGraphRunner {
 public:
  // `cache` must hold `scratch_page`, a page no request ever owns (padding rows write there). `opt`: the
  // forward options of eager steps (attention form; all_logits must be false). Graphs run only when the
  // model and cache are on CUDA with a bf16 / FP8 latent cache (the f32 stand-in cache takes per-request
  // host paths) and decode tokens take the absorbed attention form; otherwise run() always declines.
  // `log`: print capture lines to stdout (a failed capture's warning always goes to stderr). `pass` and
  // `tokens` (new tokens per request: 1, or steps + 1 for verify; at most a page): what the graphs run;
  // draft graphs need the model's MTP layer.
  CudaGraphRunner(const model::Model& model, model::KvCache& cache, int32_t scratch_page, int64_t max_bs,
                  model::ForwardOptions opt, bool log = true, GraphPass pass = GraphPass::decode,
                  int64_t tokens = 1);
  ~CudaGraphRunner();
  CudaGraphRunner(const CudaGraphRunner&) = delete;
  CudaGraphRunner& operator=(const CudaGraphRunner&) = delete;

  // Whether graphs can run at all (see the constructor), and the key `fb` would replay (nullopt: eager;
  // also while a trace recorder is active, since traces time every op).
  bool enabled() const;
  std::optional<GraphKey> key_for(const model::ForwardBatch& fb) const;

  // Captures every batch bucket at the smallest context bucket; returns the seconds it took.
  double capture_all();
  // Captures `k` now unless it exists (tests; run() does it on first use).
  void capture(const GraphKey& k);

  // A decode step's logits [B, vocab] (f32, a fresh CUDA tensor) through its graph, or nullopt when the
  // batch does not replay one (run it eagerly). Validates the batch on the host first.
  std::optional<Tensor> run(const model::ForwardBatch& fb);
  // Any pass: the forward's output through its graph (fresh CUDA tensors): logits [B x tokens, vocab] and,
  // for verify / draft, the final normed hidden states [B x tokens, H]; nullopt: run it eagerly. `hidden`
  // (draft only): the MTP layer's input [B, H], f32 on the device.
  std::optional<model::ForwardOutput> run_pass(const model::ForwardBatch& fb,
                                               const Tensor& hidden = Tensor());

  CudaGraphStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Whether this build can capture CUDA graphs (built with CUDA).
bool cuda_graphs_built();

}  // namespace dsaserve::runtime
