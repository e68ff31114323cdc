// The Gloo backend and the TCP store: ranks as threads of this process, each with its own store client
// and Gloo context (real TCP transport on 127.0.0.1). tests/dist/ranks_test.cpp runs them as processes.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"
#include "dist/gloo_communicator.h"
#include "dist/process_groups.h"
#include "dist/store.h"
#include "trace/trace.h"

namespace dsaserve::dist {
namespace {

using namespace std::chrono_literals;

// Runs fn(rank, communicator) on `n` threads, one world group; returns every rank's error, a line each
// (empty: none).
std::string run_ranks(int64_t n, const std::function<void(int64_t, Communicator&)>& fn,
                      std::chrono::milliseconds timeout = 20s) {
  TcpStoreServer server("127.0.0.1", 0);
  std::vector<std::string> errors{size_t(n)};
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        TcpStore store("127.0.0.1", server.port(), 10s);
        GlooOptions o;
        o.timeout = timeout;
        auto c = make_gloo_communicator(store, "world/0", "world", r, n, o);
        fn(r, *c);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  // Every rank's error, not the first: a rank that fails its own check at once can tear its connections
  // down while a peer is still connecting, and that peer's error ("connection closed") is then not the
  // one a test looks for.
  std::string all;
  for (int64_t r = 0; r < n; ++r)
    if (!errors[size_t(r)].empty())
      all += fmt::format("{}rank {}: {}", all.empty() ? "" : "\n", r, errors[size_t(r)]);
  return all;
}

std::vector<float> values(const Tensor& t) { return t.to_f32_vector(); }

TEST(TcpStore, SetGetAndTimeout) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore a("127.0.0.1", server.port(), 5s), b("127.0.0.1", server.port(), 5s);
  std::thread later([&] {
    std::this_thread::sleep_for(50ms);
    a.set("k", {'x', 'y'});
  });
  EXPECT_EQ(b.get("k", 5s), (std::vector<char>{'x', 'y'}));  // waits for the set
  later.join();
  try {
    b.get("missing", 100ms);
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'missing' was not set within 100 ms"), std::string::npos);
  }
  EXPECT_THROW(TcpStore("127.0.0.1", 1, 200ms), Error);  // nobody listens on port 1
}

TEST(TcpStore, ParseHostPort) {
  EXPECT_EQ(parse_host_port("10.0.0.1:5000", "--dist-init-addr"),
            (std::pair<std::string, uint16_t>{"10.0.0.1", 5000}));
  EXPECT_EQ(parse_host_port("[::1]:80", "--dist-init-addr").first, "::1");
  EXPECT_THROW(parse_host_port("host", "--dist-init-addr"), Error);
  EXPECT_THROW(parse_host_port("host:99999", "--dist-init-addr"), Error);
  EXPECT_THROW(parse_host_port("host:", "--dist-init-addr"), Error);
}

class Gloo : public ::testing::TestWithParam<int64_t> {};

TEST_P(Gloo, EveryCollective) {
  const int64_t n = GetParam();
  const std::string err = run_ranks(n, [n](int64_t r, Communicator& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), n);
    // all_reduce: rank r holds [r, 10 r, 1.5]; the sum over ranks.
    Tensor t = Tensor::from_vector({float(r), 10.f * float(r), 1.5f}, {3});
    c.all_reduce(t);
    const float s = float(n * (n - 1) / 2);
    EXPECT_EQ(values(t), (std::vector<float>{s, 10 * s, 1.5f * float(n)}));
    // reduce_scatter: in [n * 2] = r + i at i; rank r gets elements 2r, 2r+1 summed.
    std::vector<float> in;
    for (int64_t i = 0; i < 2 * n; ++i) in.push_back(float(r + i));
    Tensor rs_out = Tensor::empty({2}, DType::f32);
    c.reduce_scatter(Tensor::from_vector(in, {2 * n}), rs_out);
    EXPECT_EQ(values(rs_out), (std::vector<float>{s + float(n * 2 * r), s + float(n * (2 * r + 1))}));
    // reduce_scatter_v: rank q receives q rows of [3] (rank 0 none); element e of the input is r + e.
    {
      std::vector<int64_t> rrows;
      int64_t rtotal = 0;
      for (int64_t q = 0; q < n; ++q) rtotal += (rrows.emplace_back(q), q);
      std::vector<float> rin;
      for (int64_t e = 0; e < rtotal * 3; ++e) rin.push_back(float(r + e));
      Tensor rv_out = Tensor::empty({r, 3}, DType::f32);
      c.reduce_scatter_v(Tensor::from_vector(rin, {rtotal, 3}), rv_out, rrows);
      const int64_t first = r * (r - 1) / 2;  // rows before this rank's
      for (int64_t e = 0; e < r * 3; ++e)
        EXPECT_EQ(rv_out.data<float>()[e], s + float(n * (first * 3 + e))) << "rank " << r << " e " << e;
    }
    // all_gather of [2, 2] blocks (any dtype: i32 here).
    Tensor g_in = Tensor::empty({2, 2}, DType::i32);
    for (int i = 0; i < 4; ++i) g_in.data<int32_t>()[i] = int32_t(100 * r + i);
    Tensor g_out = Tensor::empty({2 * n, 2}, DType::i32);
    c.all_gather(g_in, g_out);
    for (int64_t q = 0; q < n; ++q)
      for (int i = 0; i < 4; ++i) EXPECT_EQ(g_out.data<int32_t>()[q * 4 + i], 100 * q + i);
    // all_gather_v: rank q holds q + 1 rows of [q, ...] (rank 0 none when shifted: rows q).
    std::vector<int64_t> rows;
    int64_t total = 0;
    for (int64_t q = 0; q < n; ++q) total += (rows.emplace_back(q), q);
    Tensor v_in = Tensor::empty({r, 3}, DType::f32);
    for (int64_t i = 0; i < r * 3; ++i) v_in.data<float>()[i] = float(r);
    Tensor v_out = Tensor::empty({total, 3}, DType::f32);
    c.all_gather_v(v_in, v_out, rows);
    int64_t row = 0;
    for (int64_t q = 0; q < n; ++q)
      for (int64_t k = 0; k < q; ++k, ++row) EXPECT_EQ(v_out.data<float>()[row * 3 + 2], float(q));
    // all_to_all: block q of rank r holds 10 r + q; afterwards block q holds 10 q + r.
    std::vector<float> a2a;
    for (int64_t q = 0; q < n; ++q) a2a.push_back(float(10 * r + q));
    Tensor a_out = Tensor::empty({n}, DType::f32);
    c.all_to_all(Tensor::from_vector(a2a, {n}), a_out);
    for (int64_t q = 0; q < n; ++q) EXPECT_EQ(values(a_out)[size_t(q)], float(10 * q + r));
    // all_to_all_v: rank r sends q rows (valued 100 r + q) to rank q; receives r rows from each.
    std::vector<int64_t> send, recv;
    std::vector<float> sv;
    for (int64_t q = 0; q < n; ++q) {
      send.push_back(q);
      recv.push_back(r);
      for (int64_t k = 0; k < q; ++k) sv.push_back(float(100 * r + q));
    }
    Tensor s_in = sv.empty() ? Tensor::empty({0}, DType::f32) : Tensor::from_vector(sv, {int64_t(sv.size())});
    Tensor s_out = Tensor::empty({r * n}, DType::f32);
    c.all_to_all_v(s_in, send, s_out, recv);
    for (int64_t q = 0; q < n; ++q)
      for (int64_t k = 0; k < r; ++k) EXPECT_EQ(s_out.data<float>()[q * r + k], float(100 * q + r));
    // broadcast from the last rank.
    Tensor b = Tensor::from_vector({float(r), 7.f}, {2});
    c.broadcast(b, n - 1);
    EXPECT_EQ(values(b), (std::vector<float>{float(n - 1), 7.f}));
    c.barrier();
  });
  EXPECT_EQ(err, "");
}

INSTANTIATE_TEST_SUITE_P(Ranks, Gloo, ::testing::Values(1, 2, 4));

// The variable forms as attention DP's MLP gathers use them when one DP group decodes while another
// prefills (tp 4, attention DP 2): rows [1, 0, 11, 11] of 64 values, a rank with none between ranks with
// some; then [0, 1, 11, 11] and [11, 11, 1, 0].
TEST(Gloo, VariableFormsWithAnEmptyRankBetween) {
  for (const std::vector<int64_t>& rows :
       {std::vector<int64_t>{1, 0, 11, 11}, std::vector<int64_t>{0, 1, 11, 11},
        std::vector<int64_t>{11, 11, 1, 0}, std::vector<int64_t>{3, 0, 0, 2}}) {
    const std::string err = run_ranks(
        4,
        [&](int64_t r, Communicator& c) {
          const int64_t H = 64, total = rows[0] + rows[1] + rows[2] + rows[3];
          int64_t before = 0;
          for (int64_t q = 0; q < r; ++q) before += rows[size_t(q)];
          Tensor mine = Tensor::empty({rows[size_t(r)], H}, DType::f32);
          for (int64_t i = 0; i < mine.numel(); ++i) mine.data<float>()[i] = float(r);
          Tensor all = Tensor::empty({total, H}, DType::f32);
          c.all_gather_v(mine, all, rows);
          int64_t row = 0;
          for (int64_t q = 0; q < 4; ++q)
            for (int64_t k = 0; k < rows[size_t(q)]; ++k, ++row)
              EXPECT_EQ(all.data<float>()[row * H], float(q));
          Tensor in = Tensor::empty({total, H}, DType::f32);
          for (int64_t i = 0; i < in.numel(); ++i) in.data<float>()[i] = float(r + 1);
          Tensor out = Tensor::empty({rows[size_t(r)], H}, DType::f32);
          c.reduce_scatter_v(in, out, rows);
          for (int64_t i = 0; i < out.numel(); ++i) EXPECT_EQ(out.data<float>()[i], 10.f) << "rank " << r;
          (void)before;
        },
        5s);
    EXPECT_EQ(err, "") << fmt::format("rows {}", fmt::join(rows, ","));
  }
}

TEST(GlooErrors, MismatchedShapesAndDtypes) {
  EXPECT_NE(run_ranks(2,
                      [](int64_t, Communicator& c) {
                        Tensor t = Tensor::empty({2}, DType::bf16);
                        c.all_reduce(t);
                      })
                .find("sums f32, i32 or i64"),
            std::string::npos);
  EXPECT_NE(run_ranks(2,
                      [](int64_t, Communicator& c) {
                        Tensor in = Tensor::empty({3}, DType::f32), out = Tensor::empty({1}, DType::f32);
                        c.reduce_scatter(in, out);
                      })
                .find("is not 2 blocks"),
            std::string::npos);
}

TEST(GlooErrors, APeerThatNeverCallsTimesOut) {
  // Rank 1 connects and then returns without joining the all-reduce: rank 0 fails within its timeout.
  const auto t0 = std::chrono::steady_clock::now();
  const std::string err = run_ranks(
      2,
      [](int64_t r, Communicator& c) {
        if (r == 1) {
          std::this_thread::sleep_for(3s);  // hangs (then leaves without calling)
          return;
        }
        Tensor t = Tensor::from_vector({1.f}, {1});
        c.all_reduce(t);
      },
      1000ms);
  EXPECT_NE(err.find("all_reduce"), std::string::npos) << err;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

TEST(ProcessGroups, EveryGroupOfALayoutConnects) {
  // tp 4, ep 2, attn dp 2: attn_tp pairs {0,1},{2,3}; attn_dp {0,2},{1,3}; moe_tp {0,1},{2,3}; ep
  // {0,2},{1,3}.
  const ParallelLayout layout{4, 2, 2};
  TcpStoreServer server("127.0.0.1", 0);
  std::vector<std::string> errors(4);
  std::vector<float> sums(4 * std::size(kAllGroups));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      try {
        TcpStore store("127.0.0.1", server.port(), 10s);
        ProcessGroups pg(layout, r,
                         [&](const std::string& prefix, const std::string& g, int64_t gr, int64_t gs) {
                           return make_gloo_communicator(store, prefix, g, gr, gs, GlooOptions{});
                         });
        for (GroupKind k : kAllGroups) {
          Tensor t = Tensor::from_vector({float(r)}, {1});
          pg.comm(k).all_reduce(t);
          sums[size_t(r) * std::size(kAllGroups) + size_t(k)] = t.to_f32_vector()[0];
        }
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) ASSERT_EQ(e, "");
  for (int64_t r = 0; r < 4; ++r) {
    for (GroupKind k : kAllGroups) {
      float expect = 0;
      for (int64_t q : layout.group(k, r).ranks) expect += float(q);
      EXPECT_EQ(sums[size_t(r) * std::size(kAllGroups) + size_t(k)], expect) << to_string(k) << " rank " << r;
    }
  }
}

TEST(Collectives, RecordTraceSpans) {
  trace::Recorder rec;
  trace::set_active(&rec);
  const std::string err = run_ranks(2, [](int64_t, Communicator& c) {
    Tensor t = Tensor::from_vector({1.f, 2.f}, {2});
    c.all_reduce(t, "attn_tp_all_reduce");
  });
  trace::set_active(nullptr);
  ASSERT_EQ(err, "");
  int spans = 0;
  for (const trace::Event& e : rec.events()) {
    if (e.cat != "collective") continue;
    ++spans;
    EXPECT_EQ(e.name, "attn_tp_all_reduce");
    EXPECT_EQ(e.args["group"], "world");
    EXPECT_EQ(e.args["group_size"], 2);
    EXPECT_EQ(e.args["bytes"], 8.0);
  }
  EXPECT_EQ(spans, 2);  // one per rank (thread)
}

}  // namespace
}  // namespace dsaserve::dist
