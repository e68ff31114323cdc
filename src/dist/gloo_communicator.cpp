// Gloo's collectives (allreduce, allgather, allgatherv, alltoallv, broadcast, barrier; reduce-scatter by
// its halving-doubling algorithm, the variable form with a rank of no rows by allreduce) on CPU tensors.
#include "dist/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace dsaserve::dist {

namespace {

// dist::Store as Gloo's rendezvous store.
class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(dist::Store& s, std::chrono::milliseconds timeout) : s_(s), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { s_.set(key, data); }
  std::vector<char> get(const std::string& key) override { return s_.get(key, timeout_); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    for (const auto& k : keys) s_.get(k, timeout);
  }

 private:
  dist::Store& s_;
  std::chrono::milliseconds timeout_;
};

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(std::string group, int64_t rank, int64_t size, std::shared_ptr<gloo::Context> ctx,
                   std::shared_ptr<gloo::transport::Device> dev)
      : Communicator(std::move(group), rank, size), ctx_(std::move(ctx)), dev_(std::move(dev)) {}

 protected:
  void do_all_reduce(Tensor& t) override {
    run("all_reduce", [&] {
      gloo::AllreduceOptions o(ctx_);
      o.setTag(next_tag());
      switch (t.dtype()) {
        case DType::f32: set_sum<float>(o, t); break;
        case DType::i32: set_sum<int32_t>(o, t); break;
        case DType::i64: set_sum<int64_t>(o, t); break;
        default: fail("dist {} all_reduce: sums f32, i32 or i64 on the CPU, got {}", group(), t.describe());
      }
      gloo::allreduce(o);
    });
  }

  void do_reduce_scatter(const Tensor& in, Tensor& out) override {
    DSA_CHECK(in.dtype() == DType::f32, "dist {} reduce_scatter: sums f32 on the CPU, got {}", group(),
              in.describe());
    run("reduce_scatter", [&] {
      // The algorithm reduces in place over the whole buffer and leaves this rank's block at its start.
      Tensor work = in.clone();
      const int count = int(in.numel()), block = int(out.numel());
      std::vector<int> recv(size_t(size()), block);
      gloo::ReduceScatterHalvingDoubling<float> rs(ctx_, {work.data<float>()}, count, recv);
      rs.run();
      std::memcpy(out.raw_data(), work.data<float>(), out.nbytes());
    });
  }

  void do_reduce_scatter_v(const Tensor& in, Tensor& out, std::span<const int64_t> rows) override {
    DSA_CHECK(in.dtype() == DType::f32, "dist {} reduce_scatter_v: sums f32 on the CPU, got {}", group(),
              in.describe());
    if (in.numel() == 0) return;  // every rank sees the same rows: all skip
    run("reduce_scatter_v", [&] {
      Tensor work = in.clone();
      const int64_t per_row = int64_t(row_bytes(in) / sizeof(float));
      std::vector<int> recv;
      for (int64_t r : rows) recv.push_back(int(r * per_row));
      if (std::find(recv.begin(), recv.end(), 0) != recv.end()) {
        // Gloo's halving-doubling reduce-scatter breaks (a peer's connection closes, or it hangs) when a
        // rank receives nothing while others receive rows (attention DP: a decode of one token over
        // attention TP 2 beside another group's prefill): sum everything and keep this rank's rows.
        gloo::AllreduceOptions o(ctx_);
        o.setTag(next_tag());
        o.setOutput(work.data<float>(), size_t(work.numel()));
        o.setReduceFunction(
            static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        gloo::allreduce(o);
        int64_t first = 0;
        for (int64_t q = 0; q < rank(); ++q) first += rows[size_t(q)];
        if (out.numel() > 0) std::memcpy(out.raw_data(), work.data<float>() + first * per_row, out.nbytes());
        return;
      }
      gloo::ReduceScatterHalvingDoubling<float> rs(ctx_, {work.data<float>()}, int(in.numel()), recv);
      rs.run();
      if (out.numel() > 0) std::memcpy(out.raw_data(), work.data<float>(), out.nbytes());
    });
  }

  void do_all_gather(const Tensor& in, Tensor& out) override {
    run("all_gather", [&] {
      gloo::AllgatherOptions o(ctx_);
      o.setTag(next_tag());
      o.setInput(bytes(in), in.nbytes());
      o.setOutput(bytes(out), out.nbytes());
      gloo::allgather(o);
    });
  }

  void do_all_gather_v(const Tensor& in, Tensor& out, std::span<const int64_t> rows) override {
    run("all_gather_v", [&] {
      const size_t rb = row_bytes(out);
      std::vector<size_t> counts;
      for (int64_t r : rows) counts.push_back(size_t(r) * rb);
      gloo::AllgathervOptions o(ctx_);
      o.setTag(next_tag());
      o.setInput(bytes(in), in.nbytes());
      o.setOutput(bytes(out), counts);
      gloo::allgatherv(o);
    });
  }

  void do_all_to_all_v(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                       std::span<const int64_t> recv_rows) override {
    run("all_to_all", [&] {
      const auto rb = int64_t(row_bytes(in));
      std::vector<int64_t> send, recv;
      for (int64_t r : send_rows) send.push_back(r * rb);
      for (int64_t r : recv_rows) recv.push_back(r * rb);
      // Gloo wants a buffer even for zero bytes.
      uint8_t dummy_in = 0, dummy_out = 0;
      gloo::AlltoallvOptions o(ctx_);
      o.setTag(next_tag());
      o.setInput(in.nbytes() > 0 ? bytes(in) : &dummy_in, send);
      o.setOutput(out.nbytes() > 0 ? bytes(out) : &dummy_out, recv);
      gloo::alltoallv(o);
    });
  }

  void do_broadcast(Tensor& t, int64_t root) override {
    run("broadcast", [&] {
      gloo::BroadcastOptions o(ctx_);
      o.setTag(next_tag());
      o.setRoot(int(root));
      o.setOutput(bytes(t), t.nbytes());
      gloo::broadcast(o);
    });
  }

  void do_barrier() override {
    run("barrier", [&] {
      gloo::BarrierOptions o(ctx_);
      o.setTag(next_tag());
      gloo::barrier(o);
    });
  }

 private:
  template <class T>
  static void set_sum(gloo::AllreduceOptions& o, Tensor& t) {
    o.setOutput(static_cast<T*>(t.raw_data()), size_t(t.numel()));
    o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
  }
  static uint8_t* bytes(const Tensor& t) {
    DSA_CHECK(t.device() == Device::cpu, "dist gloo: a {} tensor (Gloo moves CPU tensors)", t.describe());
    return static_cast<uint8_t*>(t.raw_data());
  }
  uint32_t next_tag() { return tag_++; }
  template <class F>
  void run(const char* op, F&& f) {
    try {
      f();
    } catch (const dsaserve::Error&) {
      throw;
    } catch (const std::exception& e) {
      fail("dist {} {} (rank {} of {}) failed: {}", group(), op, rank(), size(), e.what());
    }
  }

  std::shared_ptr<gloo::Context> ctx_;
  std::shared_ptr<gloo::transport::Device> dev_;
  uint32_t tag_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(Store& store, const std::string& prefix,
                                                     std::string group, int64_t rank, int64_t size,
                                                     const GlooOptions& opt) {
  DSA_CHECK(size >= 1 && rank >= 0 && rank < size, "dist {}: rank {} of {}", group, rank, size);
  std::shared_ptr<gloo::transport::Device> dev;
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  if (size > 1) {
    try {
      gloo::transport::tcp::attr attr;
      if (!opt.host.empty()) attr.hostname = opt.host;
      dev = gloo::transport::tcp::CreateDevice(attr);
      GlooStore gs(store, opt.timeout);
      gloo::rendezvous::PrefixStore ps(prefix, gs);
      ctx = std::make_shared<gloo::rendezvous::Context>(int(rank), int(size));
      ctx->setTimeout(opt.timeout);
      ctx->connectFullMesh(ps, dev);
    } catch (const dsaserve::Error&) {
      throw;
    } catch (const std::exception& e) {
      fail("dist {}: rank {} of {} could not connect: {}", group, rank, size, e.what());
    }
  }
  return std::make_unique<GlooCommunicator>(std::move(group), rank, size, std::move(ctx), std::move(dev));
}

}  // namespace dsaserve::dist
