#pragma once
// The byte form of the plain data the ranks send each other over their control groups (step messages,
// runtime/ranks/step_message.h; the DP controller's requests and outputs, runtime/ranks/dp.h): trivially
// copyable values and vectors of them, appended in order; the reader checks every length against the
// bytes left and throws dsaserve::Error on a malformed message.
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"

namespace dsaserve::runtime::wire {

class Writer {
 public:
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  template <class T>
  void put_vec(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put<uint64_t>(v.size());
    const size_t at = out_.size();
    out_.resize(at + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(out_.data() + at, v.data(), v.size() * sizeof(T));
  }
  void put_str(const std::string& s) { put_vec(std::vector<char>(s.begin(), s.end())); }
  std::vector<uint8_t> take() { return std::move(out_); }
  size_t size() const { return out_.size(); }

 private:
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : in_(data), size_(size) {}
  explicit Reader(const std::vector<uint8_t>& in) : Reader(in.data(), in.size()) {}
  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_ + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  template <class T>
  std::vector<T> get_vec() {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto n = get<uint64_t>();
    DSA_CHECK(n <= (size_ - at_) / sizeof(T), "ranks message: a list of {} entries past its end", n);
    std::vector<T> v(static_cast<size_t>(n));
    if (n > 0) std::memcpy(v.data(), in_ + at_, size_t(n) * sizeof(T));
    at_ += size_t(n) * sizeof(T);
    return v;
  }
  std::string get_str() {
    const std::vector<char> v = get_vec<char>();
    return std::string(v.begin(), v.end());
  }
  size_t remaining() const { return size_ - at_; }
  void done() const { DSA_CHECK(at_ == size_, "ranks message: {} bytes left over", size_ - at_); }

 private:
  void need(size_t n) const { DSA_CHECK(size_ - at_ >= n, "ranks message: truncated ({} bytes)", size_); }
  const uint8_t* in_;
  size_t size_;
  size_t at_ = 0;
};

}  // namespace dsaserve::runtime::wire
