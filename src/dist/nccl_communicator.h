#pragma once
// The NCCL backend: collectives of CUDA tensors on one CUDA stream (built with the CUDA toolkit only).
// The group's ncclUniqueId travels over the rendezvous store. Collectives are enqueued on the comm stream
// and return without waiting (graph-capturable, as NCCL's are); barrier() also waits for the stream.
// With an `order` stream (the operators' stream: kernels/cuda/common/views.h op_stream, read at each
// call, so a graph capture's stream when capturing) each collective first waits for the work queued there
// and that stream then waits for the collective (CUDA events), so the operators on either side see its
// inputs written and its outputs complete while the collective runs on a stream of its own.
#include <chrono>
#include <memory>
#include <string>

#include "dist/communicator.h"
#include "dist/store.h"

struct CUstream_st;

namespace dsaserve::dist {

// Collective over the group's ranks (each on its own CUDA device, current when called); `prefix` unique
// per group. A group of one rank is a real NCCL communicator too (the same code path as many).
struct NcclStreams {
  CUstream_st* comm = nullptr;        // where the collectives run (null: the legacy default stream)
  CUstream_st* (*order)() = nullptr;  // the stream they are ordered with, read at each call; null: none
};
std::unique_ptr<Communicator> make_nccl_communicator(Store& store, const std::string& prefix,
                                                     std::string group, int64_t rank, int64_t size,
                                                     const NcclStreams& streams,
                                                     std::chrono::milliseconds timeout);
// The collectives on `stream` alone (NcclStreams{stream}; null: the legacy default stream, ordered with
// the operators' compute stream, a blocking stream, by the legacy stream's implicit synchronisation).
std::unique_ptr<Communicator> make_nccl_communicator(Store& store, const std::string& prefix,
                                                     std::string group, int64_t rank, int64_t size,
                                                     CUstream_st* stream, std::chrono::milliseconds timeout);

}  // namespace dsaserve::dist
