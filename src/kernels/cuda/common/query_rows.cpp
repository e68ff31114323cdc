#include "kernels/cuda/common/query_rows.h"

#include <algorithm>

#include "core/error.h"

namespace dsaserve::kernels::cuda {

void check_gpu(const Tensor& t, DType dt, int64_t dims, const char* what) {
  DSA_CHECK(t.defined() && t.device() == Device::cuda && t.dtype() == dt && t.dim() == dims,
            "{}: expected a {}-D {} CUDA tensor, got {}", what, dims, dtype_name(dt),
            t.defined() ? t.describe() : std::string("nothing"));
  DSA_CHECK(t.numel() == 0 || t.stride(dims - 1) == 1 || t.size(dims - 1) <= 1,
            "{}: the last dimension must be contiguous, got {}", what, t.describe());
}

RowDesc check_rows(const Tensor& page_table, int64_t page_size, const Tensor& row_seq, const Tensor& row_len,
                   int64_t rows, int64_t max_len, const char* what) {
  check_gpu(page_table, DType::i32, 2, what);
  check_gpu(row_len, DType::i32, 1, what);
  DSA_CHECK(row_len.size(0) == rows, "{}: row_len {} should have {} rows", what, row_len.describe(), rows);
  DSA_CHECK(page_size > 0 && max_len >= 0, "{}: page size {} and max length {} must be positive", what,
            page_size, max_len);
  DSA_CHECK(max_len <= page_table.size(1) * page_size,
            "{}: {} positions need {} pages, the page table has {} per sequence", what, max_len,
            (max_len + page_size - 1) / page_size, page_table.size(1));
  RowDesc d;
  if (row_seq.defined()) {
    check_gpu(row_seq, DType::i32, 1, what);
    DSA_CHECK(row_seq.size(0) == rows, "{}: row_seq {} should have {} rows", what, row_seq.describe(), rows);
    d.row_seq = row_seq.data<int32_t>();
  } else {
    DSA_CHECK(page_table.size(0) >= rows, "{}: {} rows but {} page-table rows", what, rows,
              page_table.size(0));
  }
  d.num_seqs = page_table.size(0);
  d.pt_cols = page_table.size(1);
  d.pt_stride = page_table.stride(0);
  return d;
}

Tensor gpu_i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t.to(Device::cuda);
}

}  // namespace dsaserve::kernels::cuda
