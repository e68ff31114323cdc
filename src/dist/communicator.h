#pragma once
// One process group's collectives over core Tensors (NCCL for CUDA tensors, Gloo for CPU ones).
//
// Every rank of the group calls the same collectives in the same order with matching shapes. Tensors are
// contiguous, and split along dim 0 where a collective splits: reduce_scatter's input holds size() equal
// blocks of rows, all_gather's output size() blocks, the variable-length forms take rows per rank.
// Sums (all_reduce, reduce_scatter) take f32 tensors (the CPU backend also i32 / i64; NCCL bf16 too);
// the data-movement collectives take any dtype. Errors (a peer died, the timeout passed, a shape does not
// match) throw dsaserve::Error naming the group and the collective; a communicator that threw is broken
// (its peers may be mid-collective) and the rank should end.
//
// Each call records a trace::CollectiveScope (its name — the plan's collective name where the caller
// gives one, e.g. "attn_tp_all_reduce" — group, group size and bytes in the plan's convention: the
// tensor each rank holds for all-reduce and broadcast, the gathered output for all-gather, the input for
// reduce-scatter, what this rank sends for all-to-all).
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/tensor.h"

namespace dsaserve::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int64_t rank() const { return rank_; }
  int64_t size() const { return size_; }
  const std::string& group() const { return group_; }  // "world", "attn_tp", "ep", ...

  // t = sum over the group's t, in place.
  void all_reduce(Tensor& t, const char* name = "all_reduce");
  // out [n, ...] = this rank's block of the sum of in [size() * n, ...].
  void reduce_scatter(const Tensor& in, Tensor& out, const char* name = "reduce_scatter");
  // The variable form: out [rows[rank()], ...] = this rank's rows of the sum of in [sum(rows), ...], the
  // blocks of in in rank order (rows: one entry per rank; entries may be 0).
  void reduce_scatter_v(const Tensor& in, Tensor& out, std::span<const int64_t> rows,
                        const char* name = "reduce_scatter_v");
  // out [size() * n, ...] = every rank's in [n, ...], in rank order.
  void all_gather(const Tensor& in, Tensor& out, const char* name = "all_gather");
  // out [sum(rows), ...] = every rank's in [rows[r], ...], in rank order (rows: one entry per rank).
  void all_gather_v(const Tensor& in, Tensor& out, std::span<const int64_t> rows,
                    const char* name = "all_gather_v");
  // in [size() * n, ...]: block r goes to rank r; out [size() * n, ...]: block r came from rank r.
  void all_to_all(const Tensor& in, Tensor& out, const char* name = "all_to_all");
  // The variable form: send_rows[r] rows of in go to rank r, recv_rows[r] rows of out come from rank r.
  void all_to_all_v(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                    std::span<const int64_t> recv_rows, const char* name = "all_to_all_v");
  // t = root's t (root: a rank of this group).
  void broadcast(Tensor& t, int64_t root, const char* name = "broadcast");
  void barrier();

 protected:
  Communicator(std::string group, int64_t rank, int64_t size);
  // Whether the collectives of a one-rank group are done here (no copy needed, or a local copy) instead
  // of by the backend (NCCL runs a one-rank group through NCCL: the same code path as many ranks).
  virtual bool trivial() const { return size_ == 1; }
  virtual void do_all_reduce(Tensor& t) = 0;
  virtual void do_reduce_scatter(const Tensor& in, Tensor& out) = 0;
  virtual void do_reduce_scatter_v(const Tensor& in, Tensor& out, std::span<const int64_t> rows) = 0;
  virtual void do_all_gather(const Tensor& in, Tensor& out) = 0;
  virtual void do_all_gather_v(const Tensor& in, Tensor& out, std::span<const int64_t> rows) = 0;
  virtual void do_all_to_all_v(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                               std::span<const int64_t> recv_rows) = 0;
  virtual void do_broadcast(Tensor& t, int64_t root) = 0;
  virtual void do_barrier() = 0;

 private:
  std::string group_;
  int64_t rank_ = 0, size_ = 1;
};

// Bytes of one row (dim 0) of t (of the whole of a 0-dim t).
inline size_t row_bytes(const Tensor& t) {
  size_t n = t.element_size();
  for (int64_t d = 1; d < t.dim(); ++d) n *= size_t(t.size(d));
  return n;
}

}  // namespace dsaserve::dist
