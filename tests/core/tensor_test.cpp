#include "core/tensor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "core/parallel.h"

namespace dsaserve {
namespace {

Tensor iota(const Shape& shape) {
  std::vector<float> v(size_t(shape_numel(shape)));
  std::iota(v.begin(), v.end(), 0.0f);
  return Tensor::from_vector(v, shape);
}

TEST(Tensor, ShapeStridesAndViews) {
  Tensor t = iota({2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_TRUE(t.is_contiguous());
  Tensor s = t.slice(1, 1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 2, 4}));
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.item_f32(0), 4.0f);
  EXPECT_EQ(s.item_f32(8), 16.0f);
  Tensor c = s.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_f32_vector()[9], 17.0f);
  Tensor row = t.select(0, 1).select(0, 2);
  EXPECT_EQ(row.shape(), (Shape{4}));
  EXPECT_EQ(row.item_f32(3), 23.0f);
  Tensor tr = t.view({6, 4}).transpose(0, 1);
  EXPECT_EQ(tr.shape(), (Shape{4, 6}));
  EXPECT_EQ(tr.item_f32(1), 4.0f);
  EXPECT_EQ(t.view({-1, 8}).shape(), (Shape{3, 8}));
}

TEST(Tensor, BadShapesAndIndicesThrow) {
  Tensor t = iota({2, 3});
  EXPECT_THROW(t.view({4, 2}), Error);
  EXPECT_THROW(t.view({-1, -1}), Error);
  EXPECT_THROW(t.slice(1, 2, 5), Error);
  EXPECT_THROW(t.select(0, 2), Error);
  EXPECT_THROW(t.size(2), Error);
  EXPECT_THROW(t.data<int32_t>(), Error);
  EXPECT_THROW(t.slice(1, 0, 2).view({4}), Error);
}

TEST(Tensor, ConvertsDTypesAndViewsExternalMemory) {
  Tensor t = Tensor::from_vector({1.0f, -2.5f, 3.3f, 1e-3f}, {2, 2});
  Tensor b = t.to(DType::bf16);
  EXPECT_EQ(b.dtype(), DType::bf16);
  EXPECT_EQ(b.data_u16()[2], f32_to_bf16(3.3f));
  EXPECT_EQ(b.to(DType::f32).item_f32(1), -2.5f);
  auto owner = std::make_shared<std::vector<uint8_t>>(8, 0x38);  // e4m3fn 0x38 == 1.0
  Tensor v = Tensor::from_blob(owner->data(), {2, 4}, DType::f8e4m3fn, owner);
  owner.reset();  // the view keeps the memory alive
  EXPECT_EQ(v.item_f32(7), 1.0f);
  EXPECT_EQ(Tensor::zeros({3}, DType::i64).data<int64_t>()[2], 0);
}

TEST(Tensor, CudaWithoutAllocatorIsAnError) {
  if (device_allocator(Device::cuda) != nullptr) GTEST_SKIP() << "a CUDA allocator is installed";
  EXPECT_THROW(Tensor::empty({4}, DType::f32, Device::cuda), Error);
}

// A device allocator over host memory that records the ordinals it is asked for (the ordinal logic of
// Tensor without a GPU).
class HostBackedAllocator final : public DeviceAllocator {
 public:
  std::shared_ptr<void> allocate(size_t bytes, int index) override {
    asked.push_back(index);
    return std::shared_ptr<void>(std::malloc(bytes), [](void* p) { std::free(p); });
  }
  int current_index() override { return current; }
  void copy(void* dst, Device, const void* src, Device, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void memset_zero(void* dst, size_t bytes, int index) override {
    zeroed_on.push_back(index);
    std::memset(dst, 0, bytes);
  }
  int current = 3;
  std::vector<int> asked, zeroed_on;
};

TEST(Tensor, CudaTensorsCarryTheirDeviceOrdinal) {
  if (device_allocator(Device::cuda) != nullptr) GTEST_SKIP() << "a CUDA allocator is installed";
  HostBackedAllocator a;
  set_device_allocator(Device::cuda, &a);
  struct Restore {
    ~Restore() { set_device_allocator(Device::cuda, nullptr); }
  } restore;
  EXPECT_EQ(iota({2}).device_index(), -1) << "CPU tensors have none";
  EXPECT_EQ(iota({2}).describe(), "f32[2] cpu");
  const Tensor cur = Tensor::empty({4, 6}, DType::f32, Device::cuda);
  EXPECT_EQ(cur.device_index(), 3) << "no ordinal: the current device";
  const Tensor one = Tensor::zeros({4, 6}, DType::f32, Device::cuda, 1);
  EXPECT_EQ(one.device_index(), 1);
  EXPECT_EQ(a.asked, (std::vector<int>{3, 1}));
  EXPECT_EQ(a.zeroed_on, (std::vector<int>{1}));
  EXPECT_EQ(one.describe(), "f32[4, 6] cuda:1");
  EXPECT_EQ(one.slice(0, 1, 3).device_index(), 1);
  EXPECT_EQ(one.transpose(0, 1).device_index(), 1);
  EXPECT_EQ(one.view({24}).select(0, 5).device_index(), 1);
  EXPECT_EQ(one.clone().device_index(), 1) << "a copy stays on its device";
  EXPECT_EQ(a.asked.back(), 1);
  EXPECT_EQ(iota({2}).to(Device::cuda).device_index(), 3) << "to(cuda): the current device";
  EXPECT_EQ(one.to(Device::cpu).device_index(), -1);
  EXPECT_EQ(Tensor::from_blob(one.raw_data(), {24}, DType::f32, nullptr, Device::cuda, 2).device_index(), 2);
  EXPECT_EQ(Tensor::from_blob(one.raw_data(), {24}, DType::f32, nullptr, Device::cuda).device_index(), 3);
  EXPECT_THROW(Tensor::empty({1}, DType::f32, Device::cuda, 40000), Error);
}

TEST(Parallel, CoversRangeOnceWithAnyGrain) {
  for (int64_t n : {0, 1, 7, 1000, 100003}) {
    for (int64_t grain : {1, 16, 5000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      parallel_for(n, grain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << n << " " << grain;
    }
  }
}

TEST(Parallel, NestedCallsRunInline) {
  std::atomic<int64_t> total{0};
  parallel_for(8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      parallel_for(100, 1, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
    }
  });
  EXPECT_EQ(total.load(), 800);
}

}  // namespace
}  // namespace dsaserve
