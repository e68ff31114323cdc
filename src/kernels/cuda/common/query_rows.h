#pragma once
// Host checks shared by the attention-side wrappers over query rows (attention/attention_kernels.cpp: MLA
// decode; indexer/indexer_kernels.cpp: the lightning indexer): CUDA tensors of one dtype and rank with a
// contiguous last dimension, the row description (page table, row_seq, row_len) and small i32 uploads.
// Every check throws dsaserve::Error naming the operator.
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace dsaserve::kernels::cuda {

// t is a `dims`-D CUDA tensor of dtype dt whose last dimension is contiguous.
void check_gpu(const Tensor& t, DType dt, int64_t dims, const char* what);

// The validated row description (page table, row_seq, row_len) of a launch over query rows.
struct RowDesc {
  const int32_t* row_seq = nullptr;
  int64_t num_seqs = 0, pt_cols = 0, pt_stride = 0;
};
RowDesc check_rows(const Tensor& page_table, int64_t page_size, const Tensor& row_seq, const Tensor& row_len,
                   int64_t rows, int64_t max_len, const char* what);

// i32 [n] on the GPU from host values (a synchronous upload: not under capture).
Tensor gpu_i32(const std::vector<int32_t>& v);

}  // namespace dsaserve::kernels::cuda
