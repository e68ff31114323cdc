// The plan as JSON (stable keys, one record per op per layer kind per pass) and as a text report.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "plan/plan.h"

namespace dsaserve::plan {

using nlohmann::json;

namespace {

json op_json(const Op& o, const std::string& prefix) {
  return {{"key", prefix + "/" + o.name},
          {"name", o.name},
          {"kind", to_string(o.kind)},
          {"precision", to_string(o.precision)},
          {"shape", o.shape},
          {"flops", o.flops},
          {"weight_bytes", o.weight_bytes},
          {"act_read_bytes", o.act_read_bytes},
          {"act_write_bytes", o.act_write_bytes},
          {"kv_read_bytes", o.kv_read_bytes},
          {"kv_write_bytes", o.kv_write_bytes},
          {"compute_s", o.compute_s},
          {"memory_s", o.memory_s},
          {"time_s", o.time_s()},
          {"bound", o.compute_s >= o.memory_s ? "compute" : "memory"}};
}

json coll_json(const Collective& c, const std::string& prefix) {
  return {{"key", prefix + "/" + c.name},
          {"name", c.name},
          {"kind", to_string(c.kind)},
          {"group", c.group},
          {"group_size", c.group_size},
          {"after", c.after},
          {"count", c.count},
          {"bytes", c.bytes},
          {"scale_bytes", c.scale_bytes},
          {"meta_bytes", c.meta_bytes},
          {"runs", c.runs},
          {"wire_bytes", c.wire_bytes},
          {"time_s", c.time_s}};
}

// `key` = step/pass/layer kind/name: unique, and what a trace's op span is matched against.
json ops_json(const std::vector<Op>& ops, const std::string& prefix) {
  json a = json::array();
  for (const Op& o : ops) a.push_back(op_json(o, prefix));
  return a;
}

json colls_json(const std::vector<Collective>& cs, const std::string& prefix) {
  json a = json::array();
  for (const Collective& c : cs) a.push_back(coll_json(c, prefix));
  return a;
}

json step_json(const StepPlan& s) {
  json passes = json::array();
  for (const Pass& p : s.passes) {
    json kinds = json::array();
    const std::string pp = s.name + "/" + p.name + "/";
    for (const LayerKindPlan& lp : p.layer_kinds) {
      kinds.push_back({{"name", lp.name},
                       {"layers", lp.layers},
                       {"ops", ops_json(lp.ops, pp + lp.name)},
                       {"collectives", colls_json(lp.collectives, pp + lp.name)}});
    }
    passes.push_back({{"name", p.name},
                      {"repeat", p.repeat},
                      {"mtp", p.mtp},
                      {"requests_local", p.requests_local},
                      {"tokens_local", p.tokens_local},
                      {"tokens_global", p.tokens_global},
                      {"chunks", p.chunks},
                      {"head",
                       {{"ops", ops_json(p.head_ops, pp + "head")},
                        {"collectives", colls_json(p.head_collectives, pp + "head")}}},
                      {"layer_kinds", kinds},
                      {"tail",
                       {{"ops", ops_json(p.tail_ops, pp + "tail")},
                        {"collectives", colls_json(p.tail_collectives, pp + "tail")}}}});
  }
  const StepTotals& t = s.totals;
  return {{"name", s.name},
          {"passes", passes},
          {"totals",
           {{"flops", t.flops},
            {"weight_bytes", t.weight_bytes},
            {"act_bytes", t.act_bytes},
            {"kv_read_bytes", t.kv_read_bytes},
            {"kv_write_bytes", t.kv_write_bytes},
            {"compute_floor_s", t.compute_floor_s},
            {"memory_floor_s", t.memory_floor_s},
            {"op_time_s", t.op_time_s},
            {"collectives", t.collectives},
            {"comm_bytes", t.comm_bytes},
            {"comm_wire_bytes", t.comm_wire_bytes},
            {"comm_s", t.comm_s},
            {"time_s", t.time_s},
            {"output_tokens", t.output_tokens},
            {"wire_bytes_per_output_token", t.wire_bytes_per_output_token},
            {"article_bytes_per_output_token", t.article_bytes_per_output_token}}}};
}

std::string si(double v, const char* unit) {
  if (v >= 1e12) return fmt::format("{:.2f} T{}", v / 1e12, unit);
  if (v >= 1e9) return fmt::format("{:.2f} G{}", v / 1e9, unit);
  if (v >= 1e6) return fmt::format("{:.2f} M{}", v / 1e6, unit);
  if (v >= 1e3) return fmt::format("{:.2f} K{}", v / 1e3, unit);
  return fmt::format("{:.0f} {}", v, unit);
}

std::string us(double s) { return fmt::format("{:.1f}", s * 1e6); }

void text_ops(std::string& out, const std::vector<Op>& ops, const std::vector<Collective>& colls) {
  auto coll_line = [&](const Collective& c) {
    out += fmt::format("      >> {:24} {:14} {}[{}] x{}  msg {}  wire {}  {} us{}\n", c.name,
                       to_string(c.kind), c.group, c.group_size, c.count, si(c.bytes, "B"),
                       si(c.wire_bytes + 0.0, "B"), us(c.time_s), c.runs ? "" : "  (article only: not run)");
  };
  for (const Collective& c : colls) {
    if (c.after.empty()) coll_line(c);
  }
  for (const Op& o : ops) {
    out +=
        fmt::format("    {:24} {:52} {:>11} {:>10} {:>10} {:>10} {:>9} {}\n", o.name, o.shape,
                    si(o.flops, "F"), si(o.weight_bytes, "B"), si(o.act_read_bytes + o.act_write_bytes, "B"),
                    si(o.kv_read_bytes + o.kv_write_bytes, "B"), us(o.time_s()),
                    o.compute_s >= o.memory_s ? "compute" : "memory");
    for (const Collective& c : colls) {
      if (c.after == o.name) coll_line(c);
    }
  }
}

void text_step(std::string& out, const StepPlan& s) {
  out += fmt::format("\n== {} ==\n", s.name);
  for (const Pass& p : s.passes) {
    out += fmt::format("-- pass {} x{}{}: {} request(s), {} token(s) on this rank{}, {} in the deployment\n",
                       p.name, p.repeat, p.mtp ? " (MTP layer)" : "", p.requests_local, p.tokens_local,
                       p.chunks > 1 ? fmt::format(" per chunk, {} chunks (values summed)", p.chunks) : "",
                       p.tokens_global);
    out += fmt::format("    {:24} {:52} {:>11} {:>10} {:>10} {:>10} {:>9}\n", "op", "shape", "FLOPs",
                       "weights", "act r+w", "KV r+w", "us");
    out += "  [head]\n";
    text_ops(out, p.head_ops, p.head_collectives);
    for (const LayerKindPlan& lp : p.layer_kinds) {
      out += fmt::format("  [{}] x{} layers (first {}), per layer:\n", lp.name, lp.layers.size(),
                         lp.layers.front());
      text_ops(out, lp.ops, lp.collectives);
    }
    out += "  [tail]\n";
    text_ops(out, p.tail_ops, p.tail_collectives);
  }
  const StepTotals& t = s.totals;
  out += fmt::format(
      "totals per rank: {} | weights read {} | activations {} | KV read {} write {}\n"
      "  floors: compute {:.3f} ms, memory {:.3f} ms, sum of per-op max {:.3f} ms\n"
      "  communication: {} collectives, {} message, {} sent, {:.3f} ms\n"
      "  estimate (no overlap): {:.3f} ms per step\n"
      "  per output token ({} per step): {} on the wire (all ranks), {} by the article's count\n",
      si(t.flops, "FLOP"), si(t.weight_bytes, "B"), si(t.act_bytes, "B"), si(t.kv_read_bytes, "B"),
      si(t.kv_write_bytes, "B"), t.compute_floor_s * 1e3, t.memory_floor_s * 1e3, t.op_time_s * 1e3,
      t.collectives, si(t.comm_bytes, "B"), si(t.comm_wire_bytes, "B"), t.comm_s * 1e3, t.time_s * 1e3,
      t.output_tokens, si(t.wire_bytes_per_output_token, "B"), si(t.article_bytes_per_output_token, "B"));
}

}  // namespace

json to_json(const Plan& p) {
  const Deployment& d = p.deployment;
  const Hardware& h = p.hardware;
  const MemoryPlan& m = p.memory;
  json weights = json::array();
  for (const WeightGroup& g : m.weights) {
    weights.push_back({{"name", g.name},
                       {"params", g.params},
                       {"shards", g.shards},
                       {"sharded_over", g.sharded_over},
                       {"bytes_per_gpu", g.bytes_per_gpu}});
  }
  return {{"model_type", p.model_type},
          {"deployment",
           {{"tp", d.tp},
            {"ep_size", d.ep_size},
            {"attn_dp_size", d.attn_dp_size},
            {"attn_tp_size", d.attn_tp()},
            {"moe_tp_size", d.moe_tp()},
            {"moe_dense_tp_size", d.dense_tp()},
            {"moe_a2a_backend", to_string(d.moe_a2a_backend)},
            {"kv_cache_dtype", to_string(d.kv_cache_dtype)},
            {"speculative_num_draft_tokens", d.speculative_num_draft_tokens},
            {"batch", d.batch},
            {"context", d.context},
            {"prefill_tokens", d.prefill()},
            {"chunked_prefill_size", d.chunked_prefill_size},
            {"mem_fraction_static", d.mem_fraction_static},
            {"dsa_topk_broadcast", d.dsa_topk_broadcast},
            {"deepep_fp8_dispatch", d.deepep_fp8_dispatch},
            {"accept_length", d.accept_length}}},
          {"hardware",
           {{"gpu", h.name},
            {"memory_bytes", h.memory_bytes},
            {"hbm_bytes_per_s", h.hbm_bytes_per_s},
            {"bf16_flops_per_s", h.bf16_flops_per_s},
            {"fp8_flops_per_s", h.fp8_flops_per_s},
            {"interconnect_bytes_per_s", h.interconnect_bytes_per_s},
            {"collective_latency_s", h.collective_latency_s}}},
          {"memory",
           {{"weights", weights},
            {"weights_sharded_bytes", m.weights_sharded_bytes},
            {"weights_replicated_bytes", m.weights_replicated_bytes},
            {"weights_bytes", m.weights_bytes},
            {"routed_expert_bytes", m.routed_expert_bytes},
            {"kv_values_per_token", m.kv_values_per_token},
            {"kv_bytes_per_token_layer", m.kv_bytes_per_token_layer},
            {"kv_bytes_per_token", m.kv_bytes_per_token},
            {"indexer_bytes_per_token", m.indexer_bytes_per_token},
            {"mtp_bytes_per_token", m.mtp_bytes_per_token},
            {"cache_bytes_per_token", m.cache_bytes_per_token},
            {"budget_bytes", m.budget_bytes},
            {"kv_pool_bytes", m.kv_pool_bytes},
            {"kv_tokens_fit", m.kv_tokens_fit},
            {"max_requests_per_dp_group", m.max_requests_per_dp_group},
            {"max_requests", m.max_requests},
            {"batch_fits", m.batch_fits},
            {"expert_read_floor_s", m.expert_read_floor_s},
            {"weight_read_floor_s", m.weight_read_floor_s}}},
          {"steps", {{"prefill", step_json(p.prefill)}, {"decode", step_json(p.decode)}}},
          {"notes", p.notes}};
}

std::string to_text(const Plan& p) {
  const Deployment& d = p.deployment;
  const Hardware& h = p.hardware;
  const MemoryPlan& m = p.memory;
  std::string out;
  out += fmt::format(
      "dsaserve plan: {} on {} x {} | tp {} (attention: {} DP group(s) of TP {}; MoE: EP {} x TP {}, a2a {}; "
      "dense MLP TP {})\n",
      p.model_type, d.tp, h.name, d.tp, d.attn_dp_size, d.attn_tp(), d.ep_size, d.moe_tp(),
      to_string(d.moe_a2a_backend), d.dense_tp());
  out += fmt::format(
      "KV cache {} | MTP draft tokens {} | batch {} x context {} | prefill {} tokens, chunks of {}\n",
      to_string(d.kv_cache_dtype), d.speculative_num_draft_tokens, d.batch, d.context, d.prefill(),
      d.chunk());
  out += fmt::format(
      "ceilings: HBM {:.1f} TB/s, bf16 {:.0f} TFLOP/s, FP8 {:.0f} TFLOP/s, interconnect {:.0f} GB/s + {:.0f} "
      "us per "
      "collective, GPU memory {:.2f} GB\n",
      h.hbm_bytes_per_s / 1e12, h.bf16_flops_per_s / 1e12, h.fp8_flops_per_s / 1e12,
      h.interconnect_bytes_per_s / 1e9, h.collective_latency_s * 1e6, h.memory_bytes / 1e9);
  out += "\n== memory per GPU ==\n";
  for (const WeightGroup& g : m.weights) {
    out += fmt::format(
        "  {:32} {:>10} params  {:>12}  {}\n", g.name, si(double(g.params), ""), si(g.bytes_per_gpu, "B"),
        g.shards > 1 ? fmt::format("sharded / {} over {}", g.shards, g.sharded_over) : "replicated");
  }
  out += fmt::format(
      "  weights: {} sharded + {} replicated = {} (routed experts {})\n"
      "  KV: {} values/token; {:.0f} B/token/layer -> {} B/token; indexer {} B/token; MTP {} B/token; total "
      "{} "
      "B/token\n"
      "  budget {:.2f} GB (x {}), KV pool {:.2f} GB -> {} tokens; {} request(s) of {} per attention group, "
      "{} in "
      "all (batch {}: {})\n"
      "  read floors: routed experts {:.2f} ms, all weights {:.2f} ms\n",
      si(m.weights_sharded_bytes, "B"), si(m.weights_replicated_bytes, "B"), si(m.weights_bytes, "B"),
      si(m.routed_expert_bytes, "B"), m.kv_values_per_token, m.kv_bytes_per_token_layer, m.kv_bytes_per_token,
      m.indexer_bytes_per_token, m.mtp_bytes_per_token, m.cache_bytes_per_token, m.budget_bytes / 1e9,
      d.mem_fraction_static, m.kv_pool_bytes / 1e9, m.kv_tokens_fit, m.max_requests_per_dp_group, d.context,
      m.max_requests, d.batch, m.batch_fits ? "fits" : "does not fit", m.expert_read_floor_s * 1e3,
      m.weight_read_floor_s * 1e3);
  text_step(out, p.prefill);
  text_step(out, p.decode);
  if (!p.notes.empty()) {
    out += "\nnotes:\n";
    for (const std::string& n : p.notes) out += "  - " + n + "\n";
  }
  return out;
}

}  // namespace dsaserve::plan
