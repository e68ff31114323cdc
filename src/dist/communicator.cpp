// Argument checks and trace spans shared by every backend; the backends move the bytes.
#include "dist/communicator.h"

#include <numeric>

#include "trace/trace.h"

namespace dsaserve::dist {

namespace {

void check_tensor(const Communicator& c, const Tensor& t, const char* what, const char* op) {
  DSA_CHECK(t.defined() && t.is_contiguous(), "dist {} {}: {} must be a defined contiguous tensor", c.group(),
            op, what);
}

int64_t rows_of(const Tensor& t) { return t.dim() == 0 ? 1 : t.size(0); }

// Rows of in/out must have the same shape past dim 0 and the same dtype and device.
void check_rows_match(const Communicator& c, const Tensor& in, const Tensor& out, const char* op) {
  check_tensor(c, in, "input", op);
  check_tensor(c, out, "output", op);
  DSA_CHECK(in.dtype() == out.dtype() && in.device() == out.device() && in.dim() == out.dim() &&
                in.dim() >= 1 && row_bytes(in) == row_bytes(out),
            "dist {} {}: input {} and output {} do not match", c.group(), op, in.describe(), out.describe());
}

void check_counts(const Communicator& c, std::span<const int64_t> rows, const char* what, const char* op) {
  DSA_CHECK(int64_t(rows.size()) == c.size(), "dist {} {}: {} has {} entries for {} ranks", c.group(), op,
            what, rows.size(), c.size());
  for (int64_t r : rows) DSA_CHECK(r >= 0, "dist {} {}: {} has a negative count {}", c.group(), op, what, r);
}

int64_t sum(std::span<const int64_t> v) { return std::accumulate(v.begin(), v.end(), int64_t(0)); }

}  // namespace

Communicator::Communicator(std::string group, int64_t rank, int64_t size)
    : group_(std::move(group)), rank_(rank), size_(size) {
  DSA_CHECK(size >= 1 && rank >= 0 && rank < size, "dist {}: rank {} of {}", group_, rank, size);
}

void Communicator::all_reduce(Tensor& t, const char* name) {
  check_tensor(*this, t, "tensor", "all_reduce");
  trace::CollectiveScope span(name, group_.c_str(), size_, double(t.nbytes()));
  if (!trivial()) do_all_reduce(t);
}

void Communicator::reduce_scatter(const Tensor& in, Tensor& out, const char* name) {
  check_rows_match(*this, in, out, "reduce_scatter");
  DSA_CHECK(rows_of(in) == size_ * rows_of(out),
            "dist {} reduce_scatter: input {} is not {} blocks of output {}", group_, in.describe(), size_,
            out.describe());
  trace::CollectiveScope span(name, group_.c_str(), size_, double(in.nbytes()));
  if (!trivial()) {
    do_reduce_scatter(in, out);
  } else {
    out.copy_from(in);
  }
}

void Communicator::reduce_scatter_v(const Tensor& in, Tensor& out, std::span<const int64_t> rows,
                                    const char* name) {
  check_rows_match(*this, in, out, "reduce_scatter_v");
  check_counts(*this, rows, "rows", "reduce_scatter_v");
  DSA_CHECK(
      rows[size_t(rank_)] == rows_of(out) && sum(rows) == rows_of(in),
      "dist {} reduce_scatter_v: rank {} receives {} rows (rows says {}), input has {} (rows sum to {})",
      group_, rank_, rows_of(out), rows[size_t(rank_)], rows_of(in), sum(rows));
  trace::CollectiveScope span(name, group_.c_str(), size_, double(in.nbytes()));
  if (!trivial()) {
    do_reduce_scatter_v(in, out, rows);
  } else if (rows_of(in) > 0) {
    out.copy_from(in);
  }
}

void Communicator::all_gather(const Tensor& in, Tensor& out, const char* name) {
  check_rows_match(*this, in, out, "all_gather");
  DSA_CHECK(rows_of(out) == size_ * rows_of(in), "dist {} all_gather: output {} is not {} blocks of input {}",
            group_, out.describe(), size_, in.describe());
  trace::CollectiveScope span(name, group_.c_str(), size_, double(out.nbytes()));
  if (!trivial()) {
    do_all_gather(in, out);
  } else {
    out.copy_from(in);
  }
}

void Communicator::all_gather_v(const Tensor& in, Tensor& out, std::span<const int64_t> rows,
                                const char* name) {
  check_rows_match(*this, in, out, "all_gather_v");
  check_counts(*this, rows, "rows", "all_gather_v");
  DSA_CHECK(rows[size_t(rank_)] == rows_of(in) && sum(rows) == rows_of(out),
            "dist {} all_gather_v: rank {} holds {} rows (rows says {}), output has {} (rows sum to {})",
            group_, rank_, rows_of(in), rows[size_t(rank_)], rows_of(out), sum(rows));
  trace::CollectiveScope span(name, group_.c_str(), size_, double(out.nbytes()));
  if (!trivial()) {
    do_all_gather_v(in, out, rows);
  } else if (rows_of(in) > 0) {
    out.copy_from(in);
  }
}

void Communicator::all_to_all(const Tensor& in, Tensor& out, const char* name) {
  check_rows_match(*this, in, out, "all_to_all");
  DSA_CHECK(rows_of(in) == rows_of(out) && rows_of(in) % size_ == 0,
            "dist {} all_to_all: input {} and output {} must be {} equal blocks", group_, in.describe(),
            out.describe(), size_);
  const std::vector<int64_t> rows(size_t(size_), rows_of(in) / size_);
  trace::CollectiveScope span(name, group_.c_str(), size_, double(in.nbytes()));
  if (!trivial()) {
    do_all_to_all_v(in, rows, out, rows);
  } else {
    out.copy_from(in);
  }
}

void Communicator::all_to_all_v(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                                std::span<const int64_t> recv_rows, const char* name) {
  check_rows_match(*this, in, out, "all_to_all_v");
  check_counts(*this, send_rows, "send_rows", "all_to_all_v");
  check_counts(*this, recv_rows, "recv_rows", "all_to_all_v");
  DSA_CHECK(sum(send_rows) == rows_of(in) && sum(recv_rows) == rows_of(out),
            "dist {} all_to_all_v: send_rows sum to {} for input {}, recv_rows to {} for output {}", group_,
            sum(send_rows), in.describe(), sum(recv_rows), out.describe());
  trace::CollectiveScope span(name, group_.c_str(), size_, double(in.nbytes()));
  if (!trivial()) {
    do_all_to_all_v(in, send_rows, out, recv_rows);
  } else if (rows_of(in) > 0) {
    out.copy_from(in);
  }
}

void Communicator::broadcast(Tensor& t, int64_t root, const char* name) {
  check_tensor(*this, t, "tensor", "broadcast");
  DSA_CHECK(root >= 0 && root < size_, "dist {} broadcast: root {} is not a rank of {}", group_, root, size_);
  trace::CollectiveScope span(name, group_.c_str(), size_, double(t.nbytes()));
  if (!trivial()) do_broadcast(t, root);
}

void Communicator::barrier() {
  trace::CollectiveScope span("barrier", group_.c_str(), size_, 0.0);
  if (!trivial()) do_barrier();
}

}  // namespace dsaserve::dist
