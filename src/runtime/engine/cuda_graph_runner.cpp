#include "runtime/engine/cuda_graph_runner.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include "core/error.h"
#include "trace/trace.h"

#ifdef DSASERVE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/common/graph.h"
#endif

namespace dsaserve::runtime {

#ifdef DSASERVE_HAVE_CUDA

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("CUDA graphs: {}: {}", what, cudaGetErrorString(e));
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One captured graph: the plan it was captured with (its kernels' launch plans are the graph's) and its
// static inputs (i32, packed as DecodeInputLayout), which every replay overwrites.
struct Entry {
  DecodeInputLayout layout;
  Tensor inputs;            // i32 [layout.size()] on the device
  model::StepPlan plan;     // of the padding batch at the graph's capacity
  model::StepInputs bound;  // plan's views of `inputs`
  kernels::cuda::CudaGraph graph;
};

}  // namespace

struct CudaGraphRunner::Impl {
  const model::Model& model;
  model::KvCache& cache;
  int32_t scratch = -1;
  GraphPlan plan;  // the buckets; set by CudaGraphRunner's constructor (GraphPlan(pc))
  model::ForwardOptions opt;
  bool log = true;
  GraphPass pass = GraphPass::decode;
  int64_t tokens = 1;   // new tokens per request
  bool usable = false;  // the model and cache allow graphs (constructor)
  bool disabled = false;
  std::map<GraphKey, std::unique_ptr<Entry>> graphs;
  // Every graph writes its outputs here (replays are serial): logits f32 [max_bs x tokens, vocab] and, for
  // verify / draft, the hidden states f32 [max_bs x tokens, H]. hidden_in: the draft graphs' input
  // hidden states f32 [max_bs, H] (zeroed once: padding rows read finite values).
  Tensor out;
  Tensor out_hidden;
  Tensor hidden_in;
  int32_t* pinned = nullptr;  // the host side of the one upload per replay
  int64_t pinned_n = 0;
  cudaEvent_t uploaded = nullptr;  // the last upload from `pinned` (the buffer is reused after it)
  int64_t replays = 0;
  double capture_s = 0;

  Impl(const model::Model& m, model::KvCache& c) : model(m), cache(c) {}
  ~Impl() {
    if (!graphs.empty()) cudaDeviceSynchronize();  // no replay in flight while its graph is destroyed
    graphs.clear();
    if (uploaded != nullptr) {
      cudaEventSynchronize(uploaded);
      cudaEventDestroy(uploaded);
    }
    if (pinned != nullptr) cudaFreeHost(pinned);
  }

  std::span<int32_t> host_buffer(int64_t n) {
    if (n > pinned_n) {
      cuda_check(cudaEventSynchronize(uploaded), "waiting for the last upload");
      if (pinned != nullptr) cuda_check(cudaFreeHost(pinned), "cudaFreeHost");
      pinned = nullptr;
      cuda_check(
          cudaHostAlloc(reinterpret_cast<void**>(&pinned), size_t(n) * sizeof(int32_t), cudaHostAllocDefault),
          "cudaHostAlloc");
      pinned_n = n;
    }
    return {pinned, size_t(n)};
  }

  // Packs `fb` into the pinned buffer and queues its upload into e's inputs (legacy stream).
  void upload(const model::ForwardBatch& fb, const GraphKey& k, Entry& e) {
    cuda_check(cudaEventSynchronize(uploaded), "waiting for the last upload");  // pinned is free again
    const std::span<int32_t> buf = host_buffer(e.layout.size());
    pack_decode_inputs(fb, k, scratch, buf);
    cuda_check(cudaMemcpyAsync(e.inputs.raw_data(), buf.data(), buf.size() * sizeof(int32_t),
                               cudaMemcpyHostToDevice, nullptr),
               "uploading the step inputs");
    cuda_check(cudaEventRecord(uploaded, nullptr), "cudaEventRecord");
  }

  // "decode batch 4 x context 128", "verify batch 4 x context 128 x 4 rows".
  std::string describe(const GraphKey& k) const {
    return fmt::format("{} batch {} x context {}{}", graph_pass_name(pass), k.bs, k.ctx,
                       pass == GraphPass::verify ? fmt::format(" x {} rows", k.tokens) : std::string());
  }

  // The pass's forward of `b` (its plan and inputs in `o`): the target model, or the MTP layer fed the
  // first rows of hidden_in.
  model::ForwardOutput forward(const model::ForwardBatch& b, const model::ForwardOptions& o) const {
    if (pass != GraphPass::draft) return model.forward(b, cache, o);
    return model.forward_mtp(b, hidden_in.slice(0, 0, b.num_tokens()), cache, o, 0);
  }

  Entry& capture(const GraphKey& k, bool lazy) {
    if (auto it = graphs.find(k); it != graphs.end()) return *it->second;
    const auto t0 = std::chrono::steady_clock::now();
    auto e = std::make_unique<Entry>();
    e->layout = decode_input_layout(k, cache.page_size);
    e->inputs = Tensor::empty({e->layout.size()}, DType::i32, Device::cuda);
    const model::ForwardBatch pad = padding_batch(k, scratch, cache.page_size);
    model::ForwardOptions o = opt;
    o.all_logits = false;  // every row of a decoding request (graph_batch): every row's logits, no gather
    o.keep_hidden = pass != GraphPass::decode;
    // The plan at the graph's capacity, without host rows: its kernel launch plans depend on (bs, ctx,
    // tokens) only, so they hold for every batch the graph replays.
    const model::StepCapacity capacity = graph_capacity(k, cache.page_size);
    e->plan = model.plan_step(pad, o, &capacity, pass == GraphPass::draft);
    DSA_CHECK(e->plan.layout == e->layout, "CUDA graphs: the capture plan does not have the graph's layout");
    e->bound = e->plan.bind(e->inputs);
    upload(pad, k, *e);
    o.plan = &e->plan;
    o.inputs = &e->bound;
    // One eager run of the same shapes (writes only the scratch page): lazily made device data (RoPE
    // tables, GEMM plans and weight caches) exists before the capture, which may not create it.
    (void)forward(pad, o);
    cuda_check(cudaDeviceSynchronize(), "the eager run before a capture");
    const int64_t rows = k.bs * k.tokens;
    {
      kernels::cuda::GraphCapture cap;
      {
        const model::ForwardOutput fo = forward(pad, o);
        Tensor dst = out.slice(0, 0, rows);
        kernels::copy_rows(dst, fo.logits);
        if (o.keep_hidden) {
          Tensor dh = out_hidden.slice(0, 0, rows);
          kernels::copy_rows(dh, fo.hidden);
        }
      }  // the step's pool blocks go back to the graph pool (shared by every graph)
      e->graph = cap.finish();
    }
    const double s = seconds_since(t0);
    capture_s += s;
    if (log) {
      fmt::print("dsaserve: CUDA graph {}captured: {} ({} nodes) in {:.1f} ms\n", lazy ? "lazily " : "",
                 describe(k), e->graph.num_nodes(), s * 1e3);
      std::fflush(stdout);
    }
    return *graphs.emplace(k, std::move(e)).first->second;
  }

  // A failed capture turns graphs off (the step and later ones run eagerly).
  bool try_capture(const GraphKey& k, bool lazy) {
    try {
      capture(k, lazy);
      return true;
    } catch (const std::exception& ex) {
      disabled = true;
      graphs.clear();
      fmt::print(
          "dsaserve: warning: CUDA graph capture of {} failed, running {} steps eagerly from now on: {}\n",
          describe(k), graph_pass_name(pass), ex.what());
      std::fflush(stdout);
      return false;
    }
  }
};

CudaGraphRunner::CudaGraphRunner(const model::Model& model, model::KvCache& cache, int32_t scratch_page,
                                 int64_t max_bs, model::ForwardOptions opt, bool log, GraphPass pass,
                                 int64_t tokens)
    : impl_(std::make_unique<Impl>(model, cache)) {
  Impl& m = *impl_;
  const model::ModelConfig& c = model.config();
  DSA_CHECK(tokens >= 1 && (pass == GraphPass::verify || tokens == 1),
            "CUDA graphs: {} graphs of {} tokens per request", graph_pass_name(pass), tokens);
  m.scratch = scratch_page;
  m.pass = pass;
  m.tokens = tokens;
  GraphPlanConfig pc;
  pc.max_bs = max_bs;
  pc.index_topk = c.has_indexer() ? c.index_topk : 0;
  pc.page_size = cache.page_size;
  m.plan = GraphPlan(pc);
  m.opt = opt;
  m.log = log;
  const bool on_cuda = model.weights().embed_tokens.device() == Device::cuda && !cache.kv.empty() &&
                       cache.kv[0].device() == Device::cuda;
  GraphSupport gs;
  gs.max_bs = max_bs;
  gs.built = true;
  gs.device = on_cuda ? Device::cuda : Device::cpu;
  gs.kernel_format_cache = on_cuda && cache.kv[0].dtype() != DType::f32;
  gs.attention = opt.attention;
  gs.mha_min_tokens = opt.mha_min_tokens;
  gs.tokens = tokens;
  // Draft graphs run the MTP layer over its own KV layer; a padding request's rows fit one page.
  const bool mtp_ok = pass != GraphPass::draft ||
                      (model.num_mtp_layers() > 0 && int64_t(cache.kv.size()) > c.num_hidden_layers);
  m.usable = cuda_graph_max_batch(gs) > 0 && mtp_ok && tokens <= cache.page_size;
  if (!m.usable) return;
  DSA_CHECK(scratch_page >= 0 && scratch_page < cache.num_pages,
            "CUDA graphs: scratch page {} outside the cache's {} pages", scratch_page, cache.num_pages);
  cuda_check(cudaEventCreateWithFlags(&m.uploaded, cudaEventDisableTiming), "cudaEventCreate");
  m.out = Tensor::empty({max_bs * tokens, c.vocab_size}, DType::f32, Device::cuda);
  if (pass != GraphPass::decode)
    m.out_hidden = Tensor::empty({max_bs * tokens, c.hidden_size}, DType::f32, Device::cuda);
  if (pass == GraphPass::draft)
    m.hidden_in = Tensor::zeros({max_bs, c.hidden_size}, DType::f32, Device::cuda);
}

CudaGraphRunner::~CudaGraphRunner() = default;

bool CudaGraphRunner::enabled() const { return impl_->usable && !impl_->disabled; }

std::optional<GraphKey> CudaGraphRunner::key_for(const model::ForwardBatch& fb) const {
  if (!enabled() || trace::active() != nullptr) return std::nullopt;
  if (impl_->pass == GraphPass::decode) return decode_graph_key(fb, impl_->plan);
  return spec_graph_key(fb, impl_->tokens, impl_->plan);
}

double CudaGraphRunner::capture_all() {
  if (!enabled() || trace::active() != nullptr) return 0;  // traced steps run eagerly
  const auto t0 = std::chrono::steady_clock::now();
  const GraphPlanConfig& pc = impl_->plan.config();
  const int64_t T = impl_->tokens;
  const int64_t ctx = context_bucket(T, pc.index_topk, pc.page_size);
  for (int64_t bs : impl_->plan.buckets()) {
    if (bs * T * ctx > pc.max_ctx_cells) break;
    if (!impl_->try_capture(GraphKey{bs, ctx, T}, false)) break;
  }
  return seconds_since(t0);
}

void CudaGraphRunner::capture(const GraphKey& k) {
  DSA_CHECK(enabled(), "CUDA graphs are off for this model / cache");
  impl_->capture(k, false);
}

std::optional<Tensor> CudaGraphRunner::run(const model::ForwardBatch& fb) {
  DSA_CHECK(impl_->pass == GraphPass::decode, "CUDA graphs: run() is the decode pass's; use run_pass()");
  std::optional<model::ForwardOutput> o = run_pass(fb);  // graphs return the R last-token rows only
  if (!o) return std::nullopt;
  return std::move(o->logits);
}

std::optional<model::ForwardOutput> CudaGraphRunner::run_pass(const model::ForwardBatch& fb,
                                                              const Tensor& hidden) {
  const std::optional<GraphKey> k = key_for(fb);
  if (!k) return std::nullopt;
  Impl& m = *impl_;
  fb.validate(m.model.config().vocab_size, m.cache.num_pages);  // the graph's ops skip their host checks
  DSA_CHECK(fb.page_size == m.cache.page_size, "batch page size {} differs from the cache's {}", fb.page_size,
            m.cache.page_size);
  const int64_t rows = fb.num_tokens();  // B x tokens
  if (m.pass == GraphPass::draft) {
    DSA_CHECK(hidden.defined() && hidden.dim() == 2 && hidden.size(0) == rows &&
                  hidden.size(1) == m.hidden_in.size(1) && hidden.dtype() == DType::f32 &&
                  hidden.device() == Device::cuda,
              "CUDA graphs: a draft step needs its hidden states f32 [{}, {}] on the device, got {}", rows,
              m.hidden_in.size(1), hidden.defined() ? hidden.describe() : std::string("nothing"));
  }
  if (m.graphs.find(*k) == m.graphs.end() && !m.try_capture(*k, true)) return std::nullopt;
  Entry& e = *m.graphs.at(*k);
  m.upload(fb, *k, e);
  if (m.pass == GraphPass::draft) {
    Tensor dst = m.hidden_in.slice(0, 0, rows);
    kernels::copy_rows(dst, hidden);  // queued before the replay on the same stream
  }
  e.graph.replay();
  ++m.replays;
  // Copied out before the next replay overwrites the static outputs.
  model::ForwardOutput o;
  o.logits = Tensor::empty({rows, m.out.size(1)}, DType::f32, Device::cuda);
  kernels::copy_rows(o.logits, m.out.slice(0, 0, rows));
  if (m.pass != GraphPass::decode) {
    o.hidden = Tensor::empty({rows, m.out_hidden.size(1)}, DType::f32, Device::cuda);
    kernels::copy_rows(o.hidden, m.out_hidden.slice(0, 0, rows));
  }
  return o;
}

CudaGraphStats CudaGraphRunner::stats() const {
  return CudaGraphStats{int64_t(impl_->graphs.size()), impl_->replays, impl_->capture_s, !enabled()};
}

bool cuda_graphs_built() { return true; }

#else  // no CUDA: graphs never run

struct CudaGraphRunner::Impl {};

CudaGraphRunner::CudaGraphRunner(const model::Model&, model::KvCache&, int32_t, int64_t,
                                 model::ForwardOptions, bool, GraphPass, int64_t)
    : impl_(std::make_unique<Impl>()) {}
CudaGraphRunner::~CudaGraphRunner() = default;
bool CudaGraphRunner::enabled() const { return false; }
std::optional<GraphKey> CudaGraphRunner::key_for(const model::ForwardBatch&) const { return std::nullopt; }
double CudaGraphRunner::capture_all() { return 0; }
void CudaGraphRunner::capture(const GraphKey&) { fail("CUDA graphs: this dsaserve was built without CUDA"); }
std::optional<Tensor> CudaGraphRunner::run(const model::ForwardBatch&) { return std::nullopt; }
std::optional<model::ForwardOutput> CudaGraphRunner::run_pass(const model::ForwardBatch&, const Tensor&) {
  return std::nullopt;
}
CudaGraphStats CudaGraphRunner::stats() const { return CudaGraphStats{0, 0, 0, true}; }
bool cuda_graphs_built() { return false; }

#endif

}  // namespace dsaserve::runtime
