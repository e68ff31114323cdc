#pragma once
// The operator table: every operator of kernels::Backend (kernels/ops.h) with the cases that hold a
// device backend to the CPU reference, at GLM-5.3's layer shapes (hidden 6144, q_lora 2048, kv_lora 512,
// rope 64, nope 192, v 256, 64 heads, indexer 32 x 128 top-2048, 256 experts top-8, moe_intermediate
// 2048, vocab 154,880) and ragged token counts, in the spirit of llama.cpp's test-backend-ops. One table,
// three users:
// - tests/kernels/cuda/op_table_test.cpp runs every case on the CUDA backend against the CPU one (GPU
//   machine) and prints a RESULT line per case;
// - bench/op_table_gpu_bench.cpp (the perf mode) times every case's device run and prints it beside its
//   floor (bytes / 4.3 TB/s or FLOPs / the measured tensor-core peak);
// - tests/kernels/op_table_coverage_test.cpp (CPU, CI) fails when kernels/ops.h's Backend has an operator
//   the table does not list (or the table names one Backend lacks): a new operator cannot ship without
//   its CPU-twin test.
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace dsaserve::kernels::testing {

// How one output is held to its reference.
enum class Measure {
  elem,     // max over rows of max |diff| / max |ref| (row_rel_error)
  gemm_l2,  // max over rows of ||diff||_2 / ||ref||_2 (row_l2_rel_error: quantised GEMMs)
  ids,      // fraction of differing i32 entries (selections; exact unless near-ties are allowed)
  bytes,    // fraction of differing bytes (bit-exact outputs)
};
std::string_view measure_name(Measure m);
double measure(Measure m, const Tensor& got, const Tensor& want);

struct Check {
  Measure measure = Measure::elem;
  double tol = 0.0;
};

// One prepared case: inputs made on both backends' devices; each run computes the operator and returns
// the outputs to compare, checks[i] holding device()[i] to reference()[i]. Running device() again redoes
// the work on the same inputs (in-place operators update their tensors again: the perf mode's repeats).
struct OpRun {
  std::function<std::vector<Tensor>()> device;
  std::function<std::vector<Tensor>()> reference;
  std::vector<Check> checks;
  double bytes = 0;  // the least memory traffic of one device run
  double flops = 0;  // its arithmetic
  bool fp8 = false;  // FLOPs on FP8 tensor cores (else bf16 / f32)
};

struct OpCase {
  std::string op;       // the Backend method it exercises
  std::string variant;  // what this case exercises of it
  std::vector<int64_t> tokens;
  // Makes the case for `tokens` T: `dev` computes device(), `ref` (the CPU reference) reference().
  std::function<OpRun(Backend& dev, Backend& ref, int64_t T)> make;
};

// How gtest prints a case (found by ADL): its names, not the struct's bytes, so that ctest's list of
// skipped GPU tests on a machine without one stays one short line each.
inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.op << " / " << c.variant; }

// Every case; the order is the order of kernels/ops.h.
std::vector<OpCase> op_table();

// The operators the table covers (distinct OpCase::op, sorted).
std::vector<std::string> op_table_ops();

}  // namespace dsaserve::kernels::testing
