#pragma once
// The NCCL backend: collectives of CUDA tensors on one CUDA stream (built with the CUDA toolkit only).
// The group's ncclUniqueId travels over the rendezvous store. Collectives are enqueued on `stream` and
// return without waiting (graph-capturable, as NCCL's are); barrier() also waits for the stream.
#include <chrono>
#include <memory>
#include <string>

#include "dist/communicator.h"
#include "dist/store.h"

struct CUstream_st;

namespace dsaserve::dist {

// Collective over the group's ranks (each on its own CUDA device, current when called); `prefix` unique
// per group. A group of one rank is a real NCCL communicator too (the same code path as many).
// stream: null for the legacy default stream (the operators' stream, kernels/cuda/backend.h).
std::unique_ptr<Communicator> make_nccl_communicator(Store& store, const std::string& prefix,
                                                     std::string group, int64_t rank, int64_t size,
                                                     CUstream_st* stream, std::chrono::milliseconds timeout);

}  // namespace dsaserve::dist
