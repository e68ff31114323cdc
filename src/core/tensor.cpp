#include "core/tensor.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

namespace dsaserve {

namespace {
DeviceAllocator* g_allocators[2] = {nullptr, nullptr};
}

std::string_view device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

void set_device_allocator(Device d, DeviceAllocator* a) { g_allocators[int(d)] = a; }
DeviceAllocator* device_allocator(Device d) { return g_allocators[int(d)]; }

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Tensor::numel() const { return shape_numel(shape_); }

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != s) return false;
    s *= shape_[i];
  }
  return true;
}

int64_t Tensor::wrap_dim(int64_t d) const {
  const int64_t n = dim();
  if (d < 0) d += n;
  DSA_CHECK(d >= 0 && d < n, "dimension {} out of range for {}", d, describe());
  return d;
}

namespace {
// The ordinal a CUDA tensor made with `index` lives on (kCurrentDevice: the allocator's current device).
int resolve_index(Device device, int index) {
  if (device == Device::cpu) return -1;
  DeviceAllocator* a = device_allocator(device);
  DSA_CHECK(a != nullptr, "no allocator for device {} (built without CUDA?)", device_name(device));
  const int i = index == Tensor::kCurrentDevice ? a->current_index() : index;
  DSA_CHECK(i >= 0 && i <= INT16_MAX, "device ordinal {} out of range", i);
  return i;
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, int index) {
  for (int64_t d : shape) DSA_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.device_index_ = int16_t(resolve_index(device, index));
  t.defined_ = true;
  const size_t bytes = t.nbytes();
  if (device == Device::cpu) {
    const size_t padded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, padded == 0 ? 64 : padded);
    DSA_CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
    t.owner_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  } else {
    t.owner_ = device_allocator(device)->allocate(bytes == 0 ? 1 : bytes, t.device_index_);
  }
  t.data_ = t.owner_.get();
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device, int index) {
  Tensor t = empty(shape, dtype, device, index);
  if (device == Device::cpu) {
    std::memset(t.data_, 0, t.nbytes());
  } else {
    device_allocator(device)->memset_zero(t.data_, t.nbytes(), t.device_index_);
  }
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                         Device device, int index) {
  Tensor t;
  t.owner_ = std::move(owner);
  t.data_ = data;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.device_index_ = int16_t(resolve_index(device, index));
  t.defined_ = true;
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape) {
  DSA_CHECK(int64_t(values.size()) == shape_numel(shape), "{} values do not fill shape {}", values.size(),
            shape_str(shape));
  Tensor t = empty(shape, DType::f32);
  std::memcpy(t.data_, values.data(), values.size() * sizeof(float));
  return t;
}

uint16_t* Tensor::data_u16() const {
  DSA_CHECK(dtype_size(dtype_) == 2, "tensor is {}, asked for 16-bit data", dtype_name(dtype_));
  return static_cast<uint16_t*>(data_);
}

uint8_t* Tensor::data_u8() const {
  DSA_CHECK(dtype_size(dtype_) == 1, "tensor is {}, asked for 8-bit data", dtype_name(dtype_));
  return static_cast<uint8_t*>(data_);
}

Tensor Tensor::view(const Shape& shape) const {
  DSA_CHECK(is_contiguous(), "view() of a non-contiguous tensor {}", describe());
  Shape s = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      DSA_CHECK(infer < 0, "view(): more than one -1 in {}", shape_str(shape));
      infer = int(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    DSA_CHECK(known > 0 && numel() % known == 0, "view(): cannot infer {} from {}", shape_str(shape),
              describe());
    s[size_t(infer)] = numel() / known;
  }
  DSA_CHECK(shape_numel(s) == numel(), "view(): shape {} does not match {}", shape_str(s), describe());
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::slice(int64_t d, int64_t begin, int64_t end) const {
  d = wrap_dim(d);
  const int64_t n = shape_[size_t(d)];
  DSA_CHECK(0 <= begin && begin <= end && end <= n, "slice [{}, {}) out of range of dim {} of {}", begin, end,
            d, describe());
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + begin * strides_[size_t(d)] * int64_t(element_size());
  t.shape_[size_t(d)] = end - begin;
  return t;
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d);
  DSA_CHECK(0 <= index && index < shape_[size_t(d)], "select index {} out of range of dim {} of {}", index, d,
            describe());
  Tensor t = slice(d, index, index + 1);
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  d0 = wrap_dim(d0);
  d1 = wrap_dim(d1);
  Tensor t = *this;
  std::swap(t.shape_[size_t(d0)], t.shape_[size_t(d1)]);
  std::swap(t.strides_[size_t(d0)], t.strides_[size_t(d1)]);
  return t;
}

namespace {
// Calls fn(src_offset_elems, dst_flat_index) for every element in row-major logical order.
template <typename Fn>
void for_each_offset(const Shape& shape, const Shape& strides, Fn fn) {
  const int64_t n = shape_numel(shape);
  if (n == 0) return;
  std::vector<int64_t> idx(shape.size(), 0);
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    fn(off, i);
    for (size_t k = shape.size(); k-- > 0;) {
      if (++idx[k] < shape[k]) {
        off += strides[k];
        break;
      }
      off -= strides[k] * (shape[k] - 1);
      idx[k] = 0;
    }
  }
}
}  // namespace

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_, device_, device_index_);
  out.copy_from(*this);
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  DSA_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_, "copy_from: {} into {}", src.describe(),
            describe());
  if (src.device_ == Device::cpu && device_ == Device::cpu) {
    if (src.is_contiguous() && is_contiguous()) {
      std::memcpy(data_, src.data_, nbytes());
      return;
    }
    DSA_CHECK(is_contiguous(), "copy_from into a non-contiguous tensor {}", describe());
    const size_t es = element_size();
    const char* s = static_cast<const char*>(src.data_);
    char* dst = static_cast<char*>(data_);
    for_each_offset(src.shape_, src.strides_, [&](int64_t off, int64_t i) {
      std::memcpy(dst + i * int64_t(es), s + off * int64_t(es), es);
    });
    return;
  }
  DSA_CHECK(src.is_contiguous() && is_contiguous(),
            "copy between devices needs contiguous tensors ({} -> {})", src.describe(), describe());
  DeviceAllocator* a = device_allocator(Device::cuda);
  DSA_CHECK(a != nullptr, "no CUDA allocator installed");
  a->copy(data_, device_, src.data_, src.device_, nbytes());
}

Tensor Tensor::to(DType dtype) const {
  DSA_CHECK(device_ == Device::cpu, "to(dtype) on {}", describe());
  if (dtype == dtype_) return *this;
  Tensor src = contiguous();
  Tensor out = empty(shape_, dtype, Device::cpu);
  convert(src.data_, dtype_, out.data_, dtype, size_t(numel()));
  return out;
}

Tensor Tensor::to(Device device) const {
  if (device == device_) return *this;
  Tensor src = contiguous();
  Tensor out = empty(shape_, dtype_, device);
  out.copy_from(src);
  return out;
}

float Tensor::item_f32(int64_t flat_index) const {
  DSA_CHECK(device_ == Device::cpu, "item_f32 on {}", describe());
  DSA_CHECK(flat_index >= 0 && flat_index < numel(), "index {} out of range of {}", flat_index, describe());
  int64_t off = 0;
  int64_t rem = flat_index;
  for (size_t k = shape_.size(); k-- > 0;) {
    off += (rem % shape_[k]) * strides_[k];
    rem /= shape_[k];
  }
  float f;
  convert(static_cast<const char*>(data_) + off * int64_t(element_size()), dtype_, &f, DType::f32, 1);
  return f;
}

std::vector<float> Tensor::to_f32_vector() const {
  Tensor t = to(DType::f32).contiguous();
  const float* p = static_cast<const float*>(t.data_);
  return std::vector<float>(p, p + t.numel());
}

std::string Tensor::describe() const {
  if (device_ == Device::cuda)
    return fmt::format("{}{} {}:{}", dtype_name(dtype_), shape_str(shape_), device_name(device_),
                       device_index_);
  return fmt::format("{}{} {}", dtype_name(dtype_), shape_str(shape_), device_name(device_));
}

}  // namespace dsaserve
