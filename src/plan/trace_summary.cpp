// measured_vs_planned: a trace's op spans next to plan_step's roofline for the same batches.
#include "plan/trace_summary.h"

#include <fmt/format.h>

#include <map>
#include <sstream>

#include "plan/step.h"

namespace dsaserve::plan {

namespace {

std::string str(const nlohmann::json& args, const char* key) {
  auto it = args.find(key);
  return it != args.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::vector<std::string> split_plus(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string part; std::getline(ss, part, '+');) out.push_back(part);
  return out;
}

struct Row {
  std::string step, pass, kind, op;
  int64_t count = 0;
  double measured_us = 0, planned_us = 0;
  bool planned = true;
};

// The traced batch of a pass span; false when the span has none.
bool step_shape(const trace::Event& e, StepShape* s) {
  const nlohmann::json& a = e.args;
  if (!a.is_object() || !a.contains("requests") || !a["requests"].is_array()) return false;
  for (const auto& r : a["requests"]) s->requests.push_back({r.at(0).get<int64_t>(), r.at(1).get<int64_t>()});
  s->decode = str(a, "step") == "decode";
  s->mtp = a.value("mtp", false);
  if (a.contains("dp_tokens") && a["dp_tokens"].is_array()) {
    for (const auto& n : a["dp_tokens"]) s->dp_tokens.push_back(n.get<int64_t>());
    s->dp_equal = a.value("dp_equal", false);
  }
  s->all_logits = a.value("all_logits", false);
  return !s->requests.empty();
}

double ratio(double measured, double planned) { return planned > 0 ? measured / planned : 0.0; }

std::string times(double r) { return r >= 10 ? fmt::format("{:.0f}x", r) : fmt::format("{:.2f}x", r); }

}  // namespace

nlohmann::json measured_vs_planned(const std::vector<trace::Event>& events, const model::ModelConfig& c,
                                   const TraceSummaryOptions& o) {
  // Planned seconds per op key, summed over the traced passes (an op record stands for each layer of
  // its kind); what the what-if deployment's plan moves per collective.
  std::map<std::string, double> planned_s;
  std::map<std::string, std::pair<std::string, double>> not_traced;  // key -> (op, seconds)
  struct StepTotal {
    int64_t passes = 0;
    double measured_us = 0, planned_us = 0;
  };
  std::map<std::string, StepTotal> steps;
  std::map<int64_t, std::string> pass_step;  // pass_id -> step
  struct WhatIf {
    std::string group;
    int64_t group_size = 0, count = 0;
    double bytes = 0, scale_bytes = 0, meta_bytes = 0, wire_bytes = 0;
  };
  std::map<std::string, WhatIf> what_if;  // "step/name"
  std::map<std::string, int64_t> what_if_steps;
  int64_t without_batch = 0, device_passes = 0, passes = 0;
  for (const trace::Event& e : events) {
    if (e.cat != "pass") continue;
    StepShape shape;
    if (!step_shape(e, &shape)) {
      ++without_batch;
      continue;
    }
    ++passes;
    if (e.args.value("device", false)) ++device_passes;
    const std::string step = str(e.args, "step");
    pass_step[e.args.value("pass_id", int64_t(-1))] = step;
    steps[step].passes += 1;
    const Pass p = plan_step(c, o.deployment, o.hardware, shape);
    const std::string prefix = step + "/" + p.name + "/";
    auto add = [&](const std::string& kind, const Op& op, double times) {
      const std::string key = prefix + kind + "/" + op.name;
      const double s = op.time_s() * times;
      planned_s[key] += s;
      if (op.name == "sampling") {  // the engine's, not the forward's: left out of the step totals
        not_traced[key] = {op.name, not_traced[key].second + s};
      } else {
        steps[step].planned_us += s * 1e6;
      }
    };
    for (const Op& op : p.head_ops) add("head", op, 1);
    for (const LayerKindPlan& k : p.layer_kinds) {
      for (const Op& op : k.ops) add(k.name, op, double(k.layers.size()));
    }
    for (const Op& op : p.tail_ops) add("tail", op, 1);
    if (o.what_if) {
      const Pass w = plan_step(c, *o.what_if, o.hardware, shape);
      what_if_steps[step] += 1;
      auto coll = [&](const Collective& col, double times) {
        if (!col.runs) return;  // the article's bill only
        WhatIf& x = what_if[step + "/" + col.name];
        x.group = col.group;
        x.group_size = col.group_size;
        x.count += int64_t(double(col.count) * times);
        x.bytes += col.bytes * double(col.count) * times;
        x.scale_bytes += col.scale_bytes * double(col.count) * times;
        x.meta_bytes += col.meta_bytes * double(col.count) * times;
        x.wire_bytes += col.wire_bytes * double(col.count) * times;
      };
      for (const Collective& col : w.head_collectives) coll(col, 1);
      for (const LayerKindPlan& k : w.layer_kinds) {
        for (const Collective& col : k.collectives) coll(col, double(k.layers.size()));
      }
      for (const Collective& col : w.tail_collectives) coll(col, 1);
    }
  }

  // Measured: op spans of the priced passes, keyed like the plan (a fused span: the sum of its parts).
  std::vector<Row> rows;
  std::map<std::string, size_t> at;
  std::vector<const trace::Event*> ops;
  nlohmann::json collectives = nlohmann::json::array();
  int64_t orphans = 0;  // op spans whose pass span is not among these events (a flush cut the pass)
  for (const trace::Event& e : events) {
    if (e.cat == "op") {
      if (pass_step.count(e.args.value("pass_id", int64_t(-1)))) {
        ops.push_back(&e);
      } else {
        ++orphans;
      }
    }
    if (e.cat == "collective") {
      collectives.push_back({{"name", e.name},
                             {"step", str(e.args, "step")},
                             {"pass", str(e.args, "pass")},
                             {"group", str(e.args, "group")},
                             {"group_size", e.args.value("group_size", int64_t(0))},
                             {"bytes", e.args.value("bytes", 0.0)},
                             {"dur_us", e.dur_exact_us}});
    }
  }
  std::stable_sort(ops.begin(), ops.end(), [](const trace::Event* a, const trace::Event* b) {
    return a->ts_exact_us < b->ts_exact_us;
  });
  for (const trace::Event* e : ops) {
    const std::string step = str(e->args, "step"), pass = str(e->args, "pass"), kind = str(e->args, "kind");
    const std::string prefix = step + "/" + pass + "/" + kind + "/", key = prefix + e->name;
    auto [it, fresh] = at.emplace(key, rows.size());
    if (fresh) {
      Row r{step, pass, kind, e->name};
      r.planned = true;
      for (const std::string& part : split_plus(e->name)) {
        const auto p = planned_s.find(prefix + part);
        if (p == planned_s.end()) {
          r.planned = false;
        } else {
          r.planned_us += p->second * 1e6;
        }
      }
      rows.push_back(r);
    }
    Row& r = rows[it->second];
    r.count += 1;
    r.measured_us += e->dur_exact_us;
    steps[step].measured_us += e->dur_exact_us;
  }

  nlohmann::json j;
  j["hardware"] = o.hardware.name;
  j["deployment"] =
      fmt::format("tp{},ep{},dp{}", o.deployment.tp, o.deployment.ep_size, o.deployment.attn_dp_size);
  j["device"] = device_passes == 0 ? "cpu" : device_passes == passes ? "cuda" : "mixed";
  j["note"] = device_passes == 0
                  ? fmt::format(
                        "measured on the CPU path (wall clock); planned: the {} roofline of the same "
                        "ops and shapes, so the ratio is the CPU reference's distance from an {}, not "
                        "an efficiency",
                        o.hardware.name, o.hardware.name)
                  : fmt::format(
                        "measured on the GPU with CUDA events; planned: the {} roofline (GPU.md "
                        "ceilings) of the same ops and shapes",
                        o.hardware.name);
  j["passes"] = passes;
  j["passes_without_batch"] = without_batch;
  j["op_spans_without_pass"] = orphans;
  nlohmann::json jr = nlohmann::json::array();
  for (const Row& r : rows) {
    jr.push_back({{"key", r.step + "/" + r.pass + "/" + r.kind + "/" + r.op},
                  {"step", r.step},
                  {"pass", r.pass},
                  {"kind", r.kind},
                  {"op", r.op},
                  {"count", r.count},
                  {"measured_us", r.measured_us},
                  {"planned_us", r.planned_us},
                  {"ratio", ratio(r.measured_us, r.planned_us)},
                  {"planned", r.planned}});
  }
  j["rows"] = jr;
  nlohmann::json js = nlohmann::json::array();
  for (const auto& [step, t] : steps) {
    js.push_back({{"step", step},
                  {"passes", t.passes},
                  {"measured_us", t.measured_us},
                  {"planned_us", t.planned_us},
                  {"ratio", ratio(t.measured_us, t.planned_us)}});
  }
  j["steps"] = js;
  nlohmann::json nt = nlohmann::json::array();
  for (const auto& [key, v] : not_traced) {
    nt.push_back({{"key", key},
                  {"planned_us", v.second * 1e6},
                  {"why", "the engine samples outside the forward pass"}});
  }
  j["not_traced"] = nt;
  nlohmann::json jc;
  jc["traced"] = collectives;
  jc["note"] = collectives.empty() ? fmt::format("no collectives ran: one process ({}), whose plan has none",
                                                 j["deployment"].get<std::string>())
                                   : "collective spans of this run";
  if (o.what_if) {
    nlohmann::json w;
    w["deployment"] =
        fmt::format("tp{},ep{},dp{}{}{}", o.what_if->tp, o.what_if->ep_size, o.what_if->attn_dp_size,
                    o.what_if->moe_a2a_backend == A2aBackend::deepep ? ",deepep" : "",
                    o.what_if->kv_cache_dtype == KvDtype::fp8_e4m3 ? ",fp8" : "");
    w["note"] =
        "what this deployment's plan would move per rank for the traced batches (each attention DP group "
        "assumed to run a batch like the traced one); not measured";
    nlohmann::json list = nlohmann::json::array();
    for (const auto& [key, x] : what_if) {
      const std::string step = key.substr(0, key.find('/'));
      const double n = double(what_if_steps[step]);
      list.push_back({{"step", step},
                      {"name", key.substr(key.find('/') + 1)},
                      {"group", x.group},
                      {"group_size", x.group_size},
                      {"count_per_step", double(x.count) / n},
                      {"bytes_per_step", x.bytes / n},
                      {"scale_bytes_per_step", x.scale_bytes / n},
                      {"meta_bytes_per_step", x.meta_bytes / n},
                      {"wire_bytes_per_step", x.wire_bytes / n}});
    }
    w["collectives"] = list;
    jc["what_if"] = w;
  }
  j["collectives"] = jc;
  return j;
}

std::string format_summary(const nlohmann::json& s) {
  std::string out = fmt::format("measured vs planned per op ({} passes; plan: {} on {}) - {}\n",
                                s["passes"].get<int64_t>(), s["hardware"].get<std::string>(),
                                s["deployment"].get<std::string>(), s["note"].get<std::string>());
  out += fmt::format("  {:<66} {:>5} {:>12} {:>12} {:>9}\n", "step/pass/kind/op", "count", "measured us",
                     "planned us", "ratio");
  for (const auto& r : s["rows"]) {
    out += fmt::format(
        "  {:<66} {:>5} {:>12.1f} {:>12} {:>9}\n", r["key"].get<std::string>(), r["count"].get<int64_t>(),
        r["measured_us"].get<double>(),
        r["planned"].get<bool>() ? fmt::format("{:.3f}", r["planned_us"].get<double>()) : "unplanned",
        r["planned"].get<bool>() ? times(r["ratio"].get<double>()) : "-");
  }
  for (const auto& r : s["not_traced"]) {
    out += fmt::format("  {:<66} {:>5} {:>12} {:>12.3f} {:>9}  ({})\n", r["key"].get<std::string>(), "-",
                       "not traced", r["planned_us"].get<double>(), "-", r["why"].get<std::string>());
  }
  for (const auto& t : s["steps"]) {
    out +=
        fmt::format("  total {:<8} {} passes: measured {:.1f} us, planned {:.3f} us, ratio {}\n",
                    t["step"].get<std::string>(), t["passes"].get<int64_t>(), t["measured_us"].get<double>(),
                    t["planned_us"].get<double>(), times(t["ratio"].get<double>()));
  }
  const auto& c = s["collectives"];
  out += fmt::format("  collectives: {}\n", c["note"].get<std::string>());
  if (c.contains("what_if")) {
    out += fmt::format("  planned under {} ({}):\n", c["what_if"]["deployment"].get<std::string>(),
                       c["what_if"]["note"].get<std::string>());
    for (const auto& x : c["what_if"]["collectives"]) {
      out += fmt::format(
          "    {:<8} {:<26} {:<8} x{:<4} {:>8.0f} per step, {:>12.0f} B per step (wire {:.0f} B)\n",
          x["step"].get<std::string>(), x["name"].get<std::string>(), x["group"].get<std::string>(),
          x["group_size"].get<int64_t>(), x["count_per_step"].get<double>(),
          x["bytes_per_step"].get<double>(), x["wire_bytes_per_step"].get<double>());
    }
  }
  return out;
}

}  // namespace dsaserve::plan
