// dsaserve inspect --model DIR|FILE [--load-format dummy] [--json-model-override-args JSON] | --config FILE
// [--json]: architecture, per-layer kinds, parameter counts
// and (with a checkpoint) its tensors grouped by layer, the bytes per dtype and the weight binding check.
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/model_options.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/dummy_weights.h"
#include "model/param_count.h"
#include "model/weights.h"

namespace dsaserve::cli {
namespace {

using model::ModelConfig;
using nlohmann::json;
namespace fs = std::filesystem;

const char* indexer_name(model::IndexerType t) {
  return t == model::IndexerType::full ? "full" : t == model::IndexerType::shared ? "shared" : "none";
}

json config_report(const ModelConfig& c) {
  json layers = json::array();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    layers.push_back({{"layer", l},
                      {"mlp", c.mlp_layer_types[size_t(l)] == model::MlpType::dense ? "dense" : "moe"},
                      {"indexer", indexer_name(c.indexer_types[size_t(l)])},
                      {"indexer_source", c.indexer_source_layer(l)}});
  }
  const model::ParamCount pc = model::count_params(c);
  json groups = json::array();
  for (const auto& g : pc.groups)
    groups.push_back({{"name", g.name}, {"total", g.total}, {"active", g.active}});
  return {
      {"model_type", c.model_type},
      {"architecture", c.architecture},
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"vocab_size", c.vocab_size},
      {"attention",
       {{"heads", c.num_attention_heads},
        {"q_lora_rank", c.q_lora_rank},
        {"kv_lora_rank", c.kv_lora_rank},
        {"qk_nope_head_dim", c.qk_nope_head_dim},
        {"qk_rope_head_dim", c.qk_rope_head_dim},
        {"v_head_dim", c.v_head_dim},
        {"softmax_scale", c.attention_scale()}}},
      {"indexer",
       {{"heads", c.index_n_heads},
        {"head_dim", c.index_head_dim},
        {"topk", c.index_topk},
        {"full_layers", c.num_full_indexer_layers()},
        {"rope_interleaved", c.indexer_rope_interleaved}}},
      {"moe",
       {{"routed_experts", c.n_routed_experts},
        {"experts_per_token", c.num_experts_per_tok},
        {"shared_experts", c.n_shared_experts},
        {"moe_intermediate_size", c.moe_intermediate_size},
        {"n_group", c.n_group},
        {"topk_group", c.topk_group},
        {"routed_scaling_factor", c.routed_scaling_factor},
        {"norm_topk_prob", c.norm_topk_prob}}},
      {"dense_intermediate_size", c.intermediate_size},
      {"rope",
       {{"type", c.rope.type},
        {"theta", c.rope.theta},
        {"factor", c.rope.factor},
        {"attention_scale_factor", c.rope.attention_scale_factor()}}},
      {"mtp_layers", c.num_nextn_predict_layers},
      {"fp8", c.fp8.enabled ? json{{"block", {c.fp8.block_n, c.fp8.block_k}}} : json(nullptr)},
      {"kv_cache_values_per_token", c.kv_cache_dim() * c.num_hidden_layers},
      {"layers", layers},
      {"params", {{"total", pc.total}, {"active", pc.active}, {"mtp", pc.mtp_total}, {"groups", groups}}},
  };
}

json checkpoint_report(const ModelConfig& c, const io::Checkpoint& ckpt) {
  std::map<std::string, json> groups;  // "layer 3", "mtp 4", "global"
  std::map<std::string, int64_t> bytes_by_dtype;
  int64_t total_bytes = 0;
  for (const std::string& name : ckpt.names()) {
    const io::TensorInfo& ti = ckpt.info(name);
    std::string group = "global";
    long idx;
    if (std::sscanf(name.c_str(), "model.layers.%ld.", &idx) == 1) {
      group = fmt::format("{} {:03}", idx >= c.num_hidden_layers ? "mtp" : "layer", idx);
    }
    const int64_t bytes = int64_t(ti.data_end - ti.data_begin);
    groups[group].push_back(
        {{"name", name}, {"dtype", dtype_safetensors_name(ti.dtype)}, {"shape", ti.shape}, {"bytes", bytes}});
    bytes_by_dtype[std::string(dtype_safetensors_name(ti.dtype))] += bytes;
    total_bytes += bytes;
  }
  json g = json::object();
  for (auto& [k, v] : groups) g[k] = v;
  return {{"files", ckpt.files().size()},
          {"tensors", ckpt.names().size()},
          {"bytes", total_bytes},
          {"bytes_by_dtype", bytes_by_dtype},
          {"groups", g}};
}

std::string human(double n) {
  if (n >= 1e12) return fmt::format("{:.2f}T", n / 1e12);
  if (n >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.2f}K", n / 1e3);
  return fmt::format("{}", int64_t(n));
}

void print_text(const json& r) {
  const json& a = r["attention"];
  const json& ix = r["indexer"];
  const json& m = r["moe"];
  fmt::print("model_type   {} ({})\n", r["model_type"].get<std::string>(),
             r["architecture"].get<std::string>());
  fmt::print("geometry     hidden {}, {} layers, vocab {}\n", r["hidden_size"].get<int64_t>(),
             r["num_hidden_layers"].get<int64_t>(), r["vocab_size"].get<int64_t>());
  fmt::print("MLA          {} heads, q_lora {}, kv_lora {}, nope {}, rope {}, v {}, scale {:.6g}\n",
             a["heads"].get<int64_t>(), a["q_lora_rank"].get<int64_t>(), a["kv_lora_rank"].get<int64_t>(),
             a["qk_nope_head_dim"].get<int64_t>(), a["qk_rope_head_dim"].get<int64_t>(),
             a["v_head_dim"].get<int64_t>(), a["softmax_scale"].get<double>());
  fmt::print("DSA indexer  {} heads x {}, top-{}, {} full layers\n", ix["heads"].get<int64_t>(),
             ix["head_dim"].get<int64_t>(), ix["topk"].get<int64_t>(), ix["full_layers"].get<int64_t>());
  fmt::print("MoE          {} routed top-{} + {} shared, intermediate {}, groups {}/{}, scale {}\n",
             m["routed_experts"].get<int64_t>(), m["experts_per_token"].get<int64_t>(),
             m["shared_experts"].get<int64_t>(), m["moe_intermediate_size"].get<int64_t>(),
             m["topk_group"].get<int64_t>(), m["n_group"].get<int64_t>(),
             m["routed_scaling_factor"].get<double>());
  fmt::print("RoPE         {} theta {}\n", r["rope"]["type"].get<std::string>(),
             r["rope"]["theta"].get<double>());
  fmt::print("MTP layers   {}\n", r["mtp_layers"].get<int64_t>());
  fmt::print("FP8          {}\n", r["fp8"].is_null() ? "no" : r["fp8"].dump());
  fmt::print("KV / token   {} values ({} per layer)\n", r["kv_cache_values_per_token"].get<int64_t>(),
             r["kv_cache_values_per_token"].get<int64_t>() / std::max<int64_t>(1, r["num_hidden_layers"]));
  fmt::print("layers:\n");
  for (const json& l : r["layers"]) {
    fmt::print(
        "  {:3}  {:5}  indexer {:6}{}\n", l["layer"].get<int64_t>(), l["mlp"].get<std::string>(),
        l["indexer"].get<std::string>(),
        l["indexer"] == "shared" ? fmt::format(" (uses layer {})", l["indexer_source"].get<int64_t>()) : "");
  }
  const json& p = r["params"];
  fmt::print("parameters (without MTP):\n");
  for (const json& g : p["groups"]) {
    fmt::print("  {:16} total {:>10}  active {:>10}\n", g["name"].get<std::string>(),
               human(double(g["total"].get<int64_t>())), human(double(g["active"].get<int64_t>())));
  }
  fmt::print("  {:16} total {:>10}  active {:>10}   (MTP layers: {})\n", "ALL",
             human(double(p["total"].get<int64_t>())), human(double(p["active"].get<int64_t>())),
             human(double(p["mtp"].get<int64_t>())));
  if (r.contains("dummy_weights")) {
    const json& d = r["dummy_weights"];
    fmt::print("dummy weights (--load-format dummy, MTP layers not included): {} tensors, {} bytes\n",
               d["tensors"].get<int64_t>(), d["bytes"].get<int64_t>());
    for (auto it = d["bytes_by_dtype"].begin(); it != d["bytes_by_dtype"].end(); ++it) {
      fmt::print("  {:8} {} bytes\n", it.key(), it.value().get<int64_t>());
    }
  }
  if (r.contains("checkpoint")) {
    const json& ck = r["checkpoint"];
    fmt::print("checkpoint: {} files, {} tensors, {} bytes; binding: {}\n", ck["files"].get<int64_t>(),
               ck["tensors"].get<int64_t>(), ck["bytes"].get<int64_t>(), r["binding"].get<std::string>());
    for (auto it = ck["bytes_by_dtype"].begin(); it != ck["bytes_by_dtype"].end(); ++it) {
      fmt::print("  {:8} {} bytes\n", it.key(), it.value().get<int64_t>());
    }
    for (auto g = ck["groups"].begin(); g != ck["groups"].end(); ++g) {
      fmt::print("  [{}]\n", g.key());
      for (const json& t : g.value()) {
        fmt::print("    {:64} {:8} {}\n", t["name"].get<std::string>(), t["dtype"].get<std::string>(),
                   t["shape"].dump());
      }
    }
  }
}

// The dummy weights' tensors (model/dummy_weights.h): count and bytes per dtype, no tensor made.
json dummy_report(const ModelConfig& c) {
  std::map<std::string, int64_t> bytes_by_dtype;
  int64_t total = 0, n = 0;
  for (const model::DummyTensor& t : model::dummy_tensors(c)) {
    int64_t e = 1;
    for (int64_t d : t.shape) e *= d;
    bytes_by_dtype[std::string(dtype_safetensors_name(t.dtype))] += e * int64_t(dtype_size(t.dtype));
    total += e * int64_t(dtype_size(t.dtype));
    ++n;
  }
  return {{"tensors", n}, {"bytes", total}, {"bytes_by_dtype", bytes_by_dtype}};
}

const CommandRegistration reg("inspect",
                              "Summarise a model config and checkpoint (architecture, layers, parameters)",
                              [](CLI::App& sub) -> CommandRun {
                                auto spec = std::make_shared<model::LoadSpec>();
                                auto config_file = std::make_shared<std::string>();
                                auto as_json = std::make_shared<bool>(false);
                                auto* mo = add_model_options(
                                    sub, *spec, "--model",
                                    "checkpoint directory, or a config file (with --load-format dummy: the "
                                    "dummy weights' tensors are reported)");
                                auto* co = sub.add_option("--config", *config_file, "a config.json alone");
                                mo->excludes(co);
                                sub.add_flag("--json", *as_json, "print JSON");
                                return [=]() -> int {
                                  if (spec->model.empty() && config_file->empty()) {
                                    throw Error("inspect: give --model DIR or --config FILE");
                                  }
                                  const fs::path path =
                                      config_file->empty() ? fs::path(spec->model) : fs::path(*config_file);
                                  const ModelConfig cfg = ModelConfig::load(path, spec->override_args);
                                  json r = config_report(cfg);
                                  if (spec->dummy()) {
                                    r["dummy_weights"] = dummy_report(cfg);
                                  } else if (!spec->model.empty() && fs::is_directory(spec->model)) {
                                    const io::Checkpoint ckpt = io::Checkpoint::open(spec->model);
                                    r["checkpoint"] = checkpoint_report(cfg, ckpt);
                                    model::ModelWeights::bind(cfg, ckpt);  // throws listing mismatches
                                    r["binding"] = "ok (no missing or unexpected tensors)";
                                  }
                                  if (*as_json) {
                                    std::cout << r.dump(2) << "\n";
                                  } else {
                                    print_text(r);
                                  }
                                  return 0;
                                };
                              });

}  // namespace
}  // namespace dsaserve::cli
