#pragma once
// Tensor: shape, strides (in elements), dtype, device and device ordinal, and a shared handle on the
// memory it views.
// A tensor either owns its buffer (Tensor::empty) or views memory kept alive by someone else's handle
// (Tensor::from_blob, e.g. a slice of an mmap'd checkpoint). Views share the handle, so a view keeps
// its memory alive. Copies of a Tensor are shallow; clone() copies the data.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace dsaserve {

enum class Device : uint8_t { cpu, cuda };
std::string_view device_name(Device d);

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[4, 128]"

// Allocates device memory; the returned handle frees it when the last owner lets go.
class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  // `bytes` on device ordinal `index` (the calling thread's current device is unchanged).
  virtual std::shared_ptr<void> allocate(size_t bytes, int index) = 0;
  // The calling thread's current device ordinal (what a tensor made without an ordinal lands on, as
  // torch's device="cuda" does).
  virtual int current_index() = 0;
  virtual void copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) = 0;
  // Zeroes `bytes` at `dst`, memory of device ordinal `index`.
  virtual void memset_zero(void* dst, size_t bytes, int index) = 0;
};
// The CUDA module installs its allocator here (kernels/cuda); core itself never calls CUDA.
void set_device_allocator(Device d, DeviceAllocator* a);
DeviceAllocator* device_allocator(Device d);  // null when none is installed

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised contiguous tensor (CPU memory is 64-byte aligned). `index`: the device ordinal of a
  // CUDA tensor (kCurrentDevice: the calling thread's current device); ignored on the CPU.
  static constexpr int kCurrentDevice = -1;
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu,
                      int index = kCurrentDevice);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu,
                      int index = kCurrentDevice);
  // A contiguous view of `data`; `owner` keeps the memory alive (may be null for memory the caller
  // guarantees outlives every view). `index`: the ordinal of the device `data` lives on
  // (kCurrentDevice: the calling thread's current device).
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                          Device device = Device::cpu, int index = kCurrentDevice);
  // A CPU f32 tensor holding a copy of values (for tests and small constants).
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape);

  bool defined() const { return defined_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  // The ordinal of the device a CUDA tensor lives on (torch's tensor.device.index); -1 on the CPU. Views,
  // copies of the Tensor and clone() keep it.
  int device_index() const { return device_index_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t size(int64_t d) const { return shape_.at(size_t(wrap_dim(d))); }
  int64_t stride(int64_t d) const { return strides_.at(size_t(wrap_dim(d))); }
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  size_t element_size() const { return dtype_size(dtype_); }
  bool is_contiguous() const;

  void* raw_data() const { return data_; }
  template <typename T>
  T* data() const {
    DSA_CHECK(dtype_of<T>() == dtype_, "tensor is {}, asked for {} data", dtype_name(dtype_),
              dtype_name(dtype_of<T>()));
    return static_cast<T*>(data_);
  }
  // Raw 16-bit / 8-bit element access for bf16, f16 and fp8 tensors.
  uint16_t* data_u16() const;
  uint8_t* data_u8() const;

  // Views (no copy). view() needs a contiguous tensor; one dimension may be -1.
  Tensor view(const Shape& shape) const;
  Tensor slice(int64_t d, int64_t begin, int64_t end) const;
  Tensor select(int64_t d, int64_t index) const;
  Tensor transpose(int64_t d0, int64_t d1) const;

  // Copies.
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;       // CPU only; conversions of core/dtype.h
  Tensor to(Device device) const;     // through the installed DeviceAllocator (CUDA: the current device)
  void copy_from(const Tensor& src);  // same shape and dtype; any devices

  // Element as f32, by flat row-major index over the logical shape (CPU; slow, for tests and tools).
  float item_f32(int64_t flat_index) const;
  std::vector<float> to_f32_vector() const;

  std::string describe() const;  // "bf16[4, 128] cpu", "f32[2] cuda:1"

 private:
  int64_t wrap_dim(int64_t d) const;

  std::shared_ptr<void> owner_;
  void* data_ = nullptr;
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
  int16_t device_index_ = -1;
  bool defined_ = false;
};

Shape contiguous_strides(const Shape& shape);
int64_t shape_numel(const Shape& shape);

}  // namespace dsaserve
