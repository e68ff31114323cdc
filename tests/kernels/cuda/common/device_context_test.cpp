// The device context (kernels/cuda/common/device_context.h): one per device ordinal with its compute, copy
// and comm streams; the operators launch on the compute stream (not the legacy default stream), graphs
// replay there; events order the streams; the caching allocator's free lists are kept per device and a
// tensor can be made on a device by its ordinal. The two-device cases skip on a one-GPU machine.
#include "kernels/cuda/common/device_context.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "gpu_test.h"
#include "kernels/cuda/common/allocator.h"
#include "kernels/cuda/common/graph.h"
#include "kernels/cuda/common/views.h"
#include "op_test_util.h"

namespace dsaserve::kernels::cuda {
namespace {

using testing::rand_f32;

class CudaDeviceContext : public testing::GpuTest {};

TEST_F(CudaDeviceContext, OnePerDeviceWithItsThreeStreams) {
  DeviceContext& c = device_context();
  EXPECT_EQ(&c, &device_context(0));
  EXPECT_EQ(c.ordinal, 0);
  ASSERT_NE(c.compute, nullptr);
  ASSERT_NE(c.copy, nullptr);
  ASSERT_NE(c.comm, nullptr);
  EXPECT_NE(c.compute, c.copy);
  EXPECT_NE(c.compute, c.comm);
  EXPECT_NE(c.copy, c.comm);
  unsigned flags = 0;
  ASSERT_EQ(cudaStreamGetFlags(c.compute, &flags), cudaSuccess);
  EXPECT_EQ(flags, unsigned(cudaStreamDefault)) << "compute orders with the legacy stream's copies";
  ASSERT_EQ(cudaStreamGetFlags(c.copy, &flags), cudaSuccess);
  EXPECT_EQ(flags, unsigned(cudaStreamNonBlocking));
  ASSERT_EQ(cudaStreamGetFlags(c.comm, &flags), cudaSuccess);
  EXPECT_EQ(flags, unsigned(cudaStreamNonBlocking));
  EXPECT_THROW(device_context(device_count()), Error);
  EXPECT_THROW(device_context(-1), Error);
}

// Outside a capture the operators' stream is the compute stream; inside a GraphCapture the capture's own.
TEST_F(CudaDeviceContext, OpStreamIsTheComputeStreamOutsideACapture) {
  EXPECT_EQ(op_stream(), device_context().compute);
  EXPECT_FALSE(capturing());
  Tensor a = rand_f32({4, 64}, 1).to(Device::cuda);
  const Tensor b = rand_f32({4, 64}, 2).to(Device::cuda);
  kernels::add_inplace(a, b);  // warm: the graph below needs no new memory
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  {
    GraphCapture capture;
    EXPECT_NE(op_stream(), device_context().compute);
    EXPECT_TRUE(capturing());
    kernels::add_inplace(a, b);
    const CudaGraph g = capture.finish();
    EXPECT_EQ(op_stream(), device_context().compute);
    EXPECT_FALSE(capturing());
  }
  EXPECT_EQ(op_stream(), device_context().compute);
}

// The operators launch on the compute stream: with that stream itself being captured (thread-local mode),
// their launches become the graph's nodes. One on the legacy stream would invalidate the capture (the legacy
// stream cannot depend on a capturing blocking stream), one on another stream would not be captured.
TEST_F(CudaDeviceContext, OperatorsLaunchOnTheComputeStream) {
  const Tensor x = rand_f32({3, 256}, 3).to(Device::cuda);
  const Tensor nw = rand_f32({256}, 4).to(Device::cuda);
  const WeightRef w{rand_f32({64, 256}, 5, 0.1f).to(Device::cuda)};
  Tensor acc = rand_f32({3, 64}, 6).to(Device::cuda);
  Backend& be = cuda_backend();
  auto step = [&] {
    const Tensor h = be.rms_norm(x, nw, 1e-6);    // an elementwise kernel
    const Tensor y = be.linear(h, w, 0, -1, {});  // an f32 cuBLASLt GEMM
    be.add_inplace(acc, y);                       // a row kernel
  };
  step();
  step();  // the allocator's free lists now hold every size the step takes
  const Tensor want_before = acc.to(Device::cpu);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const cudaStream_t s = device_context().compute;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  step();
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(s, &graph);
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << ": an operator left the compute stream";
  size_t nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  fmt::print("RESULT op=device_context_compute_stream captured_nodes={} (rms_norm, linear, add_inplace)\n",
             nodes);
  EXPECT_GE(nodes, size_t(3));
  // Replaying the captured step on the compute stream adds y once more; the legacy stream's copy sees it.
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  const Tensor after = acc.to(Device::cpu);
  const Tensor y = be.linear(be.rms_norm(x, nw, 1e-6), w, 0, -1, {}).to(Device::cpu);
  double worst = 0.0;
  for (int64_t i = 0; i < after.numel(); ++i)
    worst = std::max(worst, double(std::abs(after.item_f32(i) - want_before.item_f32(i) - y.item_f32(i))));
  EXPECT_LE(worst, 1e-4);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// CudaGraph::replay launches on the compute stream: its result is ready for the next operator there and
// for the legacy stream's copy.
TEST_F(CudaDeviceContext, GraphsReplayOnTheComputeStream) {
  Tensor a = Tensor::zeros({2, 128}, DType::f32, Device::cuda);
  const Tensor one = Tensor::from_vector(std::vector<float>(256, 1.0f), {2, 128}).to(Device::cuda);
  kernels::add_inplace(a, one);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  CudaGraph g;
  {
    GraphCapture capture;
    kernels::add_inplace(a, one);
    g = capture.finish();
  }
  for (int i = 0; i < 5; ++i) g.replay();
  kernels::add_inplace(a, one);  // eager, after the replays on the same stream
  const Tensor h = a.to(Device::cpu);
  for (int64_t i = 0; i < h.numel(); ++i) ASSERT_EQ(h.item_f32(i), 7.0f) << i;
}

// stream_wait orders two streams: a copy on the (non-blocking) copy stream sees a value the compute stream
// writes after a long fill. Without the wait the copy would read the old value.
TEST_F(CudaDeviceContext, StreamWaitOrdersTheCopyStreamAfterCompute) {
  DeviceContext& c = device_context();
  const size_t big = size_t(1) << 30;
  void* fill = nullptr;
  void* flag = nullptr;
  uint8_t* host = nullptr;
  ASSERT_EQ(cudaMalloc(&fill, big), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&flag, 64), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&host), 64), cudaSuccess);
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(cudaMemset(flag, 0, 64), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int i = 0; i < 4; ++i) ASSERT_EQ(cudaMemsetAsync(fill, i, big, c.compute), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(flag, 0x5a + round, 64, c.compute), cudaSuccess);
    stream_wait(c.copy, c.compute);
    ASSERT_EQ(cudaMemcpyAsync(host, flag, 64, cudaMemcpyDeviceToHost, c.copy), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(c.copy), cudaSuccess);
    for (int i = 0; i < 64; ++i)
      ASSERT_EQ(host[i], uint8_t(0x5a + round)) << "round " << round << " byte " << i;
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFreeHost(host);
  cudaFree(flag);
  cudaFree(fill);
}

class CudaAllocatorDevices : public testing::GpuTest {};

// A tensor made on device 0 by its ordinal: on that device, usable like any CUDA tensor, and its block
// goes back to device 0's free list (the next allocation of that size there reuses it).
TEST_F(CudaAllocatorDevices, EmptyOnDeviceZeroByOrdinal) {
  const Tensor src = rand_f32({33, 100}, 7);
  const void* p = nullptr;
  {
    Tensor t = empty_on_device({33, 100}, DType::f32, 0);
    EXPECT_EQ(t.device(), Device::cuda);
    EXPECT_EQ(t.device_index(), 0);
    EXPECT_EQ(pointer_device(t.raw_data()), 0);
    EXPECT_EQ(t.describe(), "f32[33, 100] cuda:0");
    EXPECT_EQ(t.transpose(0, 1).device_index(), 0);
    EXPECT_EQ(Tensor::empty({2}, DType::f32, Device::cuda).device_index(), 0) << "the current device";
    EXPECT_EQ(rows_f32(t, "test").rows, 33);
    t.copy_from(src);
    const Tensor back = t.to(Device::cpu);
    for (int64_t i = 0; i < src.numel(); ++i) ASSERT_EQ(back.item_f32(i), src.item_f32(i)) << i;
    p = t.raw_data();
  }
  const int64_t hits = allocator_stats().hits;
  const Tensor again = empty_on_device({33, 100}, DType::f32, 0);
  EXPECT_EQ(again.raw_data(), p) << "device 0's free list";
  EXPECT_EQ(allocator_stats().hits, hits + 1);
  EXPECT_THROW(empty_on_device({4}, DType::f32, -1), Error);
  EXPECT_THROW(empty_on_device({-1}, DType::f32, 0), Error);
}

// Two devices: each keeps its own free lists (a block freed on device 1 is never handed to device 0),
// its own context, and copies between them work.
TEST_F(CudaAllocatorDevices, EachDeviceKeepsItsOwnFreeLists) {
  if (device_count() < 2) GTEST_SKIP() << "needs two CUDA devices (" << device_count() << " visible)";
  EXPECT_EQ(device_context(1).ordinal, 1);
  EXPECT_NE(device_context(1).compute, device_context(0).compute);
  int cur = -1;
  ASSERT_EQ(cudaGetDevice(&cur), cudaSuccess);
  const Tensor src = rand_f32({1000}, 8);
  const void* p1 = nullptr;
  {
    Tensor t1 = empty_on_device({1000}, DType::f32, 1);
    EXPECT_EQ(t1.device_index(), 1);
    EXPECT_EQ(pointer_device(t1.raw_data()), 1);
    EXPECT_EQ(t1.slice(0, 10, 20).device_index(), 1) << "views keep the ordinal";
    EXPECT_EQ(t1.clone().device_index(), 1) << "clone stays on its device";
    EXPECT_EQ(t1.describe(), "f32[1000] cuda:1");
    EXPECT_THROW(rows_f32(t1.view({10, 100}), "test"), Error)
        << "an operator's view refuses cuda:1 on cuda:0";
    t1.copy_from(src);
    Tensor t0 = empty_on_device({1000}, DType::f32, 0);
    t0.copy_from(t1);  // device 1 -> device 0
    const Tensor back = t0.to(Device::cpu);
    for (int64_t i = 0; i < src.numel(); ++i) ASSERT_EQ(back.item_f32(i), src.item_f32(i)) << i;
    p1 = t1.raw_data();
  }
  int now = -1;
  ASSERT_EQ(cudaGetDevice(&now), cudaSuccess);
  EXPECT_EQ(now, cur) << "the current device is unchanged";
  const Tensor on0 = empty_on_device({1000}, DType::f32, 0);
  EXPECT_NE(on0.raw_data(), p1);
  EXPECT_EQ(on0.device_index(), 0);
  EXPECT_EQ(pointer_device(on0.raw_data()), 0);
  const Tensor on1 = empty_on_device({1000}, DType::f32, 1);
  EXPECT_EQ(on1.raw_data(), p1) << "device 1's free list";
  // Zeros on another device: zeroed on that device before the call returns (then read from here).
  const Tensor z = Tensor::zeros({1000}, DType::f32, Device::cuda, 1);
  EXPECT_EQ(z.device_index(), 1);
  const Tensor zh = z.to(Device::cpu);
  for (int64_t i = 0; i < zh.numel(); ++i) ASSERT_EQ(zh.item_f32(i), 0.0f) << i;
}

}  // namespace
}  // namespace dsaserve::kernels::cuda
