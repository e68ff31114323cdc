// NCCL's collectives (allreduce, reducescatter, allgather, broadcast; grouped broadcasts for the variable
// all-gather, grouped reduces for the variable reduce-scatter and grouped send/recv for all-to-all, as
// PyTorch's NCCL group does) on CUDA tensors.
#include "dist/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <exception>

#include "core/error.h"

namespace dsaserve::dist {

namespace {

void check(ncclResult_t r, const std::string& group, const char* op) {
  DSA_CHECK(r == ncclSuccess, "dist {} {}: NCCL error: {}", group, op, ncclGetErrorString(r));
}
void check_cuda(cudaError_t r, const std::string& group, const char* op) {
  DSA_CHECK(r == cudaSuccess, "dist {} {}: CUDA error: {}", group, op, cudaGetErrorString(r));
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::string group, int64_t rank, int64_t size, ncclComm_t comm, const NcclStreams& streams)
      : Communicator(std::move(group), rank, size),
        comm_(comm),
        stream_(streams.comm),
        order_(streams.order) {
    check_cuda(cudaMalloc(&scratch_, sizeof(float)), this->group(), "init");
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), this->group(), "init");
  }
  ~NcclCommunicator() override {
    cudaEventDestroy(event_);
    cudaFree(scratch_);
    ncclCommDestroy(comm_);
  }

 protected:
  bool trivial() const override { return false; }

  void do_all_reduce(Tensor& t) override {
    const Ordered ordered(*this);
    check(
        ncclAllReduce(ptr(t), ptr(t), size_t(t.numel()), sum_type(t, "all_reduce"), ncclSum, comm_, stream_),
        group(), "all_reduce");
  }
  void do_reduce_scatter(const Tensor& in, Tensor& out) override {
    const Ordered ordered(*this);
    check(ncclReduceScatter(ptr(in), ptr(out), size_t(out.numel()), sum_type(in, "reduce_scatter"), ncclSum,
                            comm_, stream_),
          group(), "reduce_scatter");
  }
  void do_reduce_scatter_v(const Tensor& in, Tensor& out, std::span<const int64_t> rows) override {
    const Ordered ordered(*this);
    // One reduce per rank's block, rooted at that rank, in one NCCL group.
    const ncclDataType_t type = sum_type(in, "reduce_scatter_v");
    const size_t rb = row_bytes(in), per_row = rb / in.element_size();
    const auto* src = static_cast<const uint8_t*>(ptr(in));
    check(ncclGroupStart(), group(), "reduce_scatter_v");
    size_t off = 0;
    for (int64_t r = 0; r < size(); ++r) {
      const size_t n = size_t(rows[size_t(r)]);
      if (n > 0) {
        check(ncclReduce(src + off, r == rank() ? ptr(out) : scratch_, n * per_row, type, ncclSum, int(r),
                         comm_, stream_),
              group(), "reduce_scatter_v");
      }
      off += n * rb;
    }
    check(ncclGroupEnd(), group(), "reduce_scatter_v");
  }
  void do_all_gather(const Tensor& in, Tensor& out) override {
    const Ordered ordered(*this);
    check(ncclAllGather(ptr(in), ptr(out), in.nbytes(), ncclUint8, comm_, stream_), group(), "all_gather");
  }
  void do_all_gather_v(const Tensor& in, Tensor& out, std::span<const int64_t> rows) override {
    const Ordered ordered(*this);
    const size_t rb = row_bytes(out);
    auto* dst = static_cast<uint8_t*>(ptr(out));
    check(ncclGroupStart(), group(), "all_gather_v");
    size_t off = 0;
    for (int64_t r = 0; r < size(); ++r) {
      const size_t n = size_t(rows[size_t(r)]) * rb;
      if (n > 0) {
        check(
            ncclBroadcast(r == rank() ? ptr(in) : dst + off, dst + off, n, ncclUint8, int(r), comm_, stream_),
            group(), "all_gather_v");
      }
      off += n;
    }
    check(ncclGroupEnd(), group(), "all_gather_v");
  }
  void do_all_to_all_v(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                       std::span<const int64_t> recv_rows) override {
    const Ordered ordered(*this);
    const size_t rb = row_bytes(in);
    auto* src = static_cast<const uint8_t*>(ptr(in));
    auto* dst = static_cast<uint8_t*>(ptr(out));
    check(ncclGroupStart(), group(), "all_to_all");
    size_t soff = 0, roff = 0;
    for (int64_t r = 0; r < size(); ++r) {
      const size_t s = size_t(send_rows[size_t(r)]) * rb, n = size_t(recv_rows[size_t(r)]) * rb;
      if (s > 0) check(ncclSend(src + soff, s, ncclUint8, int(r), comm_, stream_), group(), "all_to_all");
      if (n > 0) check(ncclRecv(dst + roff, n, ncclUint8, int(r), comm_, stream_), group(), "all_to_all");
      soff += s;
      roff += n;
    }
    check(ncclGroupEnd(), group(), "all_to_all");
  }
  void do_broadcast(Tensor& t, int64_t root) override {
    const Ordered ordered(*this);
    check(ncclBroadcast(ptr(t), ptr(t), t.nbytes(), ncclUint8, int(root), comm_, stream_), group(),
          "broadcast");
  }
  void do_barrier() override {
    const Ordered ordered(*this);
    check(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_), group(), "barrier");
    check_cuda(cudaStreamSynchronize(stream_), group(), "barrier");
  }

 private:
  void* ptr(const Tensor& t) const {
    DSA_CHECK(t.device() == Device::cuda, "dist {}: a {} tensor (NCCL moves CUDA tensors)", group(),
              t.describe());
    return t.raw_data();
  }
  ncclDataType_t sum_type(const Tensor& t, const char* op) const {
    switch (t.dtype()) {
      case DType::f32: return ncclFloat32;
      case DType::bf16: return ncclBfloat16;
      case DType::i32: return ncclInt32;
      case DType::i64: return ncclInt64;
      default: fail("dist {} {}: sums f32, bf16, i32 or i64 on CUDA, got {}", group(), op, t.describe());
    }
  }

  // While alive (one collective): the comm stream waits for the order stream's queued work on entry, and
  // the order stream for the comm stream's on exit (not when leaving by an exception: the collective
  // failed to enqueue).
  class Ordered {
   public:
    explicit Ordered(NcclCommunicator& c)
        : c_(c), order_(c.order_ ? c.order_() : c.stream_), unwinding_(std::uncaught_exceptions()) {
      wait(c_.stream_, order_);
    }
    ~Ordered() noexcept(false) {
      if (std::uncaught_exceptions() == unwinding_) wait(order_, c_.stream_);
    }
    Ordered(const Ordered&) = delete;
    Ordered& operator=(const Ordered&) = delete;

   private:
    void wait(cudaStream_t waiter, cudaStream_t s) {
      if (waiter == s) return;
      check_cuda(cudaEventRecord(c_.event_, s), c_.group(), "order");
      check_cuda(cudaStreamWaitEvent(waiter, c_.event_, 0), c_.group(), "order");
    }
    NcclCommunicator& c_;
    cudaStream_t order_;
    int unwinding_;
  };

  ncclComm_t comm_;
  cudaStream_t stream_;
  CUstream_st* (*order_)() = nullptr;
  cudaEvent_t event_ = nullptr;  // Ordered's (re-recorded for each wait: a wait takes the record before it)
  void* scratch_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Store& store, const std::string& prefix,
                                                     std::string group, int64_t rank, int64_t size,
                                                     CUstream_st* stream, std::chrono::milliseconds timeout) {
  return make_nccl_communicator(store, prefix, std::move(group), rank, size, NcclStreams{stream, nullptr},
                                timeout);
}

std::unique_ptr<Communicator> make_nccl_communicator(Store& store, const std::string& prefix,
                                                     std::string group, int64_t rank, int64_t size,
                                                     const NcclStreams& streams,
                                                     std::chrono::milliseconds timeout) {
  DSA_CHECK(size >= 1 && rank >= 0 && rank < size, "dist {}: rank {} of {}", group, rank, size);
  ncclUniqueId id;
  const std::string key = prefix + "/nccl_unique_id";
  if (rank == 0) {
    check(ncclGetUniqueId(&id), group, "ncclGetUniqueId");
    store.set(key, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
  } else {
    const std::vector<char> v = store.get(key, timeout);
    DSA_CHECK(v.size() == sizeof(id.internal), "dist {}: the NCCL unique id has {} bytes, not {}", group,
              v.size(), sizeof(id.internal));
    std::memcpy(id.internal, v.data(), v.size());
  }
  ncclComm_t comm = nullptr;
  check(ncclCommInitRank(&comm, int(size), id, int(rank)), group, "ncclCommInitRank");
  return std::make_unique<NcclCommunicator>(std::move(group), rank, size, comm, streams);
}

}  // namespace dsaserve::dist
