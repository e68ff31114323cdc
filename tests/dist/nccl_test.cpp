// The NCCL backend on one GPU: a world of one rank through NCCL itself (the same code path as many
// ranks), every collective on CUDA tensors equal to its one-rank result, on a stream of its own and on the
// legacy default stream. Skips without a CUDA device. The multi-GPU runs are issue #16's.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "dist/nccl_communicator.h"
#include "dist/store.h"
#include "kernels/cuda/common/device_context.h"
#include "kernels/cuda/common/runtime.h"
#include "kernels/cuda/common/views.h"
#include "trace/trace.h"

namespace dsaserve::dist {
namespace {

using namespace std::chrono_literals;

Tensor host(const std::vector<float>& v) { return Tensor::from_vector(v, {int64_t(v.size())}); }

void run_every_collective(CUstream_st* stream) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore store("127.0.0.1", server.port(), 5s);
  auto c = make_nccl_communicator(store, "world/0", "world", 0, 1, stream, 30s);
  ASSERT_EQ(c->size(), 1);
  const std::vector<float> v{1.f, -2.f, 3.5f, 4.f};
  auto sync = [&] { ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess); };

  Tensor t = host(v).to(Device::cuda);
  c->all_reduce(t);
  Tensor bf = host(v).to(DType::bf16).to(Device::cuda);
  c->all_reduce(bf);
  Tensor rv = Tensor::empty({4}, DType::f32, Device::cuda);
  const std::vector<int64_t> all{4};
  c->reduce_scatter_v(t, rv, all);  // one rank: its rows are all of them (grouped ncclReduce)
  Tensor out = Tensor::empty({4}, DType::f32, Device::cuda);
  c->reduce_scatter(rv, out);
  Tensor g = Tensor::empty({4}, DType::f32, Device::cuda);
  c->all_gather(out, g);
  const std::vector<int64_t> rows{4};
  Tensor gv = Tensor::empty({4}, DType::f32, Device::cuda);
  c->all_gather_v(g, gv, rows);
  Tensor a = Tensor::empty({4}, DType::f32, Device::cuda);
  c->all_to_all(gv, a);
  Tensor av = Tensor::empty({4}, DType::f32, Device::cuda);
  c->all_to_all_v(a, rows, av, rows);
  c->broadcast(av, 0);
  c->barrier();
  sync();
  EXPECT_EQ(t.to(Device::cpu).to_f32_vector(), v);
  EXPECT_EQ(bf.to(Device::cpu).to_f32_vector(), v);
  EXPECT_EQ(av.to(Device::cpu).to_f32_vector(), v);
  // A CPU tensor is refused with the group's name.
  Tensor cpu = host(v);
  EXPECT_THROW(c->all_reduce(cpu), Error);
}

TEST(CudaNccl, WorldOfOneEveryCollectiveOnAStream) {
  if (kernels::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  kernels::cuda::install();
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  run_every_collective(s);
  cudaStreamDestroy(s);
}

TEST(CudaNccl, WorldOfOneOnTheDefaultStreamRecordsSpans) {
  if (kernels::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  kernels::cuda::install();
  trace::Recorder rec;
  trace::set_active(&rec);
  run_every_collective(nullptr);
  trace::set_active(nullptr);
  int spans = 0;
  for (const trace::Event& e : rec.events()) spans += e.cat == "collective";
  EXPECT_EQ(spans, 11);  // 10 collectives, and the CPU tensor the backend refused inside its span
}

// On the device context's comm stream, ordered with the operators' stream (op_stream: the compute stream):
// the collective waits for the input the compute stream writes after a long fill, and the compute stream's
// next copy waits for the collective's output. Without the two waits the collective would read the old
// input, or the copy the old output.
TEST(CudaNccl, CommStreamIsOrderedWithTheComputeStream) {
  if (kernels::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  kernels::cuda::install();
  const kernels::cuda::DeviceContext& ctx = kernels::cuda::device_context();
  ASSERT_EQ(kernels::cuda::op_stream(), ctx.compute);
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore store("127.0.0.1", server.port(), 5s);
  auto c = make_nccl_communicator(store, "world/0", "world", 0, 1,
                                  NcclStreams{ctx.comm, &kernels::cuda::op_stream}, 30s);
  const size_t n = 1024, big = size_t(1) << 30;
  void* fill = nullptr;
  float* pinned = nullptr;
  ASSERT_EQ(cudaMalloc(&fill, big), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), n * sizeof(float)), cudaSuccess);
  Tensor in = Tensor::zeros({int64_t(n)}, DType::f32, Device::cuda);
  Tensor out = Tensor::zeros({int64_t(n)}, DType::f32, Device::cuda);
  for (int round = 1; round <= 3; ++round) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (size_t i = 0; i < n; ++i) pinned[i] = float(round * 1000) + float(i);
    for (int i = 0; i < 4; ++i) ASSERT_EQ(cudaMemsetAsync(fill, i, big, ctx.compute), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(in.raw_data(), pinned, n * sizeof(float), cudaMemcpyHostToDevice, ctx.compute),
              cudaSuccess);
    // The comm stream is busy too (its own fill), so the collective ends well after compute's work.
    for (int i = 0; i < 8; ++i) ASSERT_EQ(cudaMemsetAsync(fill, i, big, ctx.comm), cudaSuccess);
    c->all_gather(in, out);  // one rank: out = in
    ASSERT_EQ(cudaMemcpyAsync(pinned, out.raw_data(), n * sizeof(float), cudaMemcpyDeviceToHost, ctx.compute),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(ctx.compute), cudaSuccess);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(pinned[i], float(round * 1000) + float(i)) << round << " " << i;
  }
  c->barrier();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFreeHost(pinned);
  cudaFree(fill);
}

}  // namespace
}  // namespace dsaserve::dist
