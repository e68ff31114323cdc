#pragma once
// (Host C++ only: nvcc cannot compile fmt, so .cu files keep to plain params and return cudaError_t.)
// Errors: dsaserve::Error carries a one-line message that names what is at fault (file, tensor, field).
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace dsaserve {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace dsaserve

// DSA_CHECK(cond, "format {}", args...): throws dsaserve::Error with the formatted message when cond is
// false.
#define DSA_CHECK(cond, ...)         \
  do {                               \
    if (!(cond)) {                   \
      ::dsaserve::fail(__VA_ARGS__); \
    }                                \
  } while (0)
