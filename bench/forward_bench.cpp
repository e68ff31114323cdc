// CPU forward throughput: prefill and decode tokens/s of the fixture models (tiny, realdims, realdims_fp8).
// forward_bench [--models DIR] [--prefill N] [--decode M] [--batch B] [--threads T]
//               [--model PATH [--load-format dummy] [--json-model-override-args JSON]]  (one model instead)
// Prefill: one request of N random tokens in one step. Decode: B requests, each with an N-token context,
// then M steps of one token per request (a batch of B decodes per step).
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>

#include "core/parallel.h"
#include "model/load.h"
#include "model/model.h"

namespace {

using namespace dsaserve;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void bench(const model::LoadSpec& spec, int64_t prefill, int64_t decode, int64_t batch) {
  const std::filesystem::path dir = spec.model;
  const auto model = model::load_model(spec, Device::cpu, false);
  const int64_t V = model->config().vocab_size, ps = 64;
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(V - 1));
  const int64_t per_req_pages = (prefill + decode + ps - 1) / ps;
  model::KvCache cache = model->make_cache(per_req_pages * batch, ps);
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(batch));
  for (int64_t r = 0; r < batch; ++r) {
    tables[size_t(r)].resize(static_cast<size_t>(per_req_pages));
    std::iota(tables[size_t(r)].begin(), tables[size_t(r)].end(), int32_t(r * per_req_pages));
  }
  model::ForwardOptions fo;
  fo.all_logits = false;

  // Prefill: each request's context in its own step; the first one is timed (warm-up excluded by design:
  // the model is mmap'd and the first step also pages the weights in).
  double prefill_s = 0;
  for (int64_t r = 0; r < batch; ++r) {
    std::vector<int32_t> ids(static_cast<size_t>(prefill));
    for (auto& t : ids) t = tok(rng);
    model::ForwardBatch b;
    b.page_size = ps;
    b.add_request(ids, 0, tables[size_t(r)]);
    const auto t0 = Clock::now();
    model->forward(b, cache, fo);
    if (r == batch - 1 || batch == 1) prefill_s = seconds_since(t0);
  }
  // Decode: batch requests, one token each per step.
  const auto t0 = Clock::now();
  for (int64_t s = 0; s < decode; ++s) {
    model::ForwardBatch b;
    b.page_size = ps;
    for (int64_t r = 0; r < batch; ++r) {
      const int32_t t = tok(rng);
      b.add_request(std::span<const int32_t>(&t, 1), prefill + s, tables[size_t(r)]);
    }
    model->forward(b, cache, fo);
  }
  const double decode_s = seconds_since(t0);
  fmt::print(
      "{:<13} threads {}  prefill {:>4} tokens: {:8.1f} tokens/s ({:.1f} ms)   decode batch {:>2} x {:>3} "
      "steps "
      "at context {}: {:8.1f} tokens/s ({:.2f} ms/step)\n",
      dir.filename().string(), num_threads(), prefill, double(prefill) / prefill_s, prefill_s * 1e3, batch,
      decode, prefill, double(decode * batch) / decode_s, decode_s * 1e3 / double(decode));
}

}  // namespace

int main(int argc, char** argv) {
  std::filesystem::path models = std::filesystem::path("..") / "shared" / "fixtures" / "models";
  if (const char* e = std::getenv("DSASERVE_FIXTURES")) models = std::filesystem::path(e) / "models";
  int64_t prefill = 512, decode = 64, batch = 4;
  model::LoadSpec one;  // --model: this model only
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--models")
      models = v;
    else if (a == "--prefill")
      prefill = std::stoll(v);
    else if (a == "--decode")
      decode = std::stoll(v);
    else if (a == "--batch")
      batch = std::stoll(v);
    else if (a == "--model")
      one.model = v;
    else if (a == "--load-format")
      one.load_format = v;
    else if (a == "--json-model-override-args")
      one.override_args = v;
    else if (a == "--threads")
      set_num_threads(std::stoi(v));
    else {
      fmt::print(stderr, "unknown option {}\n", a);
      return 2;
    }
  }
  try {
    if (!one.model.empty()) {
      bench(one, prefill, decode, batch);
      return 0;
    }
    for (const char* name : {"tiny", "realdims", "realdims_fp8"}) {
      if (std::filesystem::exists(models / name))
        bench(model::LoadSpec{(models / name).string()}, prefill, decode, batch);
      else
        fmt::print("{}: missing under {} (set DSASERVE_FIXTURES or --models)\n", name, models.string());
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "forward_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
