// libFuzzer target over whole safetensors files (header length, header JSON, offsets, data):
//   cmake -DDSASERVE_FUZZ=ON with clang; scripts/sanitize.sh runs it for a fixed time.
// Every input must either open with a consistent index or throw dsaserve::Error.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/dsaserve_fuzz_" + std::to_string(::getpid()) + ".safetensors";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  try {
    auto f = dsaserve::io::SafetensorsFile::open(path);
    for (const auto& t : f->tensors()) {
      const dsaserve::Tensor v = f->get(t.name);
      if (v.nbytes() != t.data_end - t.data_begin || t.data_end + 8 > size) std::abort();
      if (v.nbytes() > 0) {
        volatile uint8_t sink = static_cast<const uint8_t*>(v.raw_data())[v.nbytes() - 1];
        (void)sink;
      }
    }
  } catch (const dsaserve::Error&) {
  }
  return 0;
}
