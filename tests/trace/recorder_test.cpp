#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "trace/trace.h"

namespace dsaserve::trace {
namespace {

TEST(TraceRecorder, OffRecordsNothing) {
  set_active(nullptr);
  Scope s("x", "op");
  EXPECT_FALSE(s.on());
  s.arg("k", 1);  // no effect, no crash
  LayerScope l(3, "moe.full");
  EXPECT_EQ(context().layer, -1);  // context untouched when off
}

// A device pass: its op spans are timed with CUDA events where this build and machine can, else they
// keep their wall-clock times (built without CUDA: no timer arg; CUDA without a device: the reason).
TEST(TraceRecorder, DevicePassOpSpans) {
  Recorder r;
  set_active(&r);
  {
    PassScope pass("decode", "decode", true);
    EXPECT_TRUE(context().device);
    LayerScope l(0, "dense.full");
    { OpScope op("o_proj"); }
  }
  EXPECT_FALSE(context().device);
  { OpScope op("after"); }  // outside any pass: never device-timed
  set_active(nullptr);
  const auto ev = r.events();
  ASSERT_EQ(ev.size(), 4u);  // pass, layer, 2 ops
  int ops = 0;
  for (const Event& e : ev) {
    if (e.cat != "op") continue;
    ++ops;
    const std::string timer = e.args.value("timer", std::string());
    if (e.name == "after") {
      EXPECT_EQ(timer, "");
    } else if (timer == "cuda_event") {
      EXPECT_GE(e.tid, kDeviceTrack);
      EXPECT_TRUE(e.args.contains("cpu_ts_us"));
      EXPECT_GE(e.dur_exact_us, 0.0);
    } else {
      EXPECT_LT(e.tid, kDeviceTrack);
      EXPECT_TRUE(timer.empty() || timer.rfind("wall_clock (cuda event: ", 0) == 0) << timer;
    }
  }
  EXPECT_EQ(ops, 2);
}

// Collective spans carry their group, size and bytes with the thread's context, and are summarised
// under "collective/step/pass/kind/name"; an annotator adds its fields to the JSON written.
TEST(TraceRecorder, CollectiveSpansAndAnnotator) {
  Recorder r;
  set_active(&r);
  {
    PassScope pass("decode", "decode");
    LayerScope l(2, "moe.full");
    CollectiveScope c("dp_all_gather", "tp", 8, 393216.0);
  }
  set_active(nullptr);
  const auto ev = r.events();
  const auto it = std::find_if(ev.begin(), ev.end(), [](const Event& e) { return e.cat == "collective"; });
  ASSERT_NE(it, ev.end());
  EXPECT_EQ(it->args["group"], "tp");
  EXPECT_EQ(it->args["group_size"], 8);
  EXPECT_EQ(it->args["bytes"], 393216.0);
  EXPECT_EQ(it->args["layer"], 2);
  bool keyed = false;
  for (const auto& row : r.summary())
    keyed = keyed || row.key == "collective/decode/decode/moe.full/dp_all_gather";
  EXPECT_TRUE(keyed);
  r.set_annotator([](const std::vector<Event>& events, nlohmann::json& j) { j["extra"] = events.size(); });
  EXPECT_EQ(r.to_json()["extra"], ev.size());
}

TEST(TraceRecorder, SpansSummaryAndChromeJson) {
  Recorder r;
  set_active(&r);
  {
    PassScope pass("prefill", "prefill");
    for (int layer = 0; layer < 2; ++layer) {
      LayerScope l(layer, "moe.full");
      EXPECT_EQ(context().layer, layer);
      { OpScope op("qkv_a_proj"); }
      {
        OpScope op("o_proj");
        Scope k("linear", "kernel");
        k.arg("flops", 12.0);
      }
    }
  }
  set_active(nullptr);
  EXPECT_EQ(context().layer, -1);
  EXPECT_STREQ(context().pass, "");
  // 1 pass + 2 layers + 4 ops + 2 kernels
  ASSERT_EQ(r.events().size(), 9u);
  const auto rows = r.summary();
  ASSERT_GE(rows.size(), 4u);
  bool saw = false;
  for (const auto& row : rows) {
    if (row.key == "prefill/prefill/moe.full/o_proj") {
      saw = true;
      EXPECT_EQ(row.count, 2);
      EXPECT_GE(row.total_us, 0.0);
    }
  }
  EXPECT_TRUE(saw);
  EXPECT_EQ(rows[0].key, "layer/moe.full");  // ordered by start time: the layer opens before its ops
  EXPECT_EQ(rows[1].key, "prefill/prefill/moe.full/qkv_a_proj");

  const auto dir = std::filesystem::temp_directory_path() / ("dsa_trace_unit_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const auto p0 = r.write(dir), p1 = r.write(dir);
  EXPECT_NE(p0, p1);
  EXPECT_EQ(p0.filename().string().rfind("trace-" + std::to_string(::getpid()) + "-", 0), 0u);
  std::ifstream f(p0);
  const auto j = nlohmann::json::parse(f);
  ASSERT_EQ(j["traceEvents"].size(), 9u);
  for (const auto& e : j["traceEvents"]) {
    EXPECT_EQ(e["ph"], "X");
    EXPECT_GE(e["dur"].get<double>(), 0.0);
  }
  int kernels = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["cat"] == "kernel") {
      ++kernels;
      EXPECT_EQ(e["args"]["flops"], 12.0);
    }
    if (e["cat"] == "op") {
      EXPECT_EQ(e["args"]["kind"], "moe.full");
      EXPECT_EQ(e["args"]["step"], "prefill");
    }
  }
  EXPECT_EQ(kernels, 2);
  EXPECT_FALSE(j["summary"].empty());
  std::filesystem::remove_all(dir);
}

// Bounded memory: events over the cap are dropped and counted; flush() writes and forgets them.
TEST(TraceRecorder, CapDropsAndFlushForgets) {
  Recorder r;
  r.set_max_events(3);
  set_active(&r);
  for (int i = 0; i < 5; ++i) Scope s("x", "engine");
  set_active(nullptr);
  EXPECT_EQ(r.events().size(), 3u);
  EXPECT_EQ(r.dropped(), 2);
  const auto dir =
      std::filesystem::temp_directory_path() / ("dsaserve-trace-flush-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const auto p0 = r.flush(dir);
  EXPECT_TRUE(r.events().empty());
  EXPECT_EQ(r.dropped(), 0);
  std::ifstream f(p0);
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["traceEvents"].size(), 3u);
  EXPECT_EQ(j["dropped_events"], 2);
  set_active(&r);
  { Scope s("y", "engine"); }
  set_active(nullptr);
  const auto p1 = r.flush(dir);
  EXPECT_NE(p0, p1);
  std::ifstream f1(p1);
  const auto j1 = nlohmann::json::parse(f1);
  ASSERT_EQ(j1["traceEvents"].size(), 1u);
  EXPECT_EQ(j1["traceEvents"][0]["name"], "y");
  EXPECT_EQ(j1["dropped_events"], 0);
  std::filesystem::remove_all(dir);
}

TEST(TraceRecorder, UnwritableDirectoryThrows) {
  Recorder r;
  EXPECT_ANY_THROW(r.write("/proc/definitely/not/here"));
}

}  // namespace
}  // namespace dsaserve::trace
