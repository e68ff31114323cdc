#pragma once
// The caching device allocator behind Tensor::empty(..., Device::cuda).
//
// Blocks are rounded up to a size class (four classes per power of two from 512 B, 2 MiB steps above
// 64 MiB) and kept on a free list of their (device ordinal, class) when the last tensor lets go, so that a
// steady-state step loop reuses memory and never calls cudaMalloc, and a block is only handed out again on
// the device it lives on. Every kernel of the backend runs on its device's compute stream, a blocking
// stream (device_context.h) that also orders with the legacy stream's copies, so a freed block handed out
// again is only touched by work queued after the work that used it before: reuse needs no events. When
// cudaMalloc fails the free lists are released and the allocation retried once.
//
// A thread that is capturing a CUDA graph (graph.h) allocates from the graph pool instead: blocks that
// captured graphs use at replay, so they are never given to eager work and never freed (only to the
// pool's own free lists, which later captures reuse).
#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace dsaserve::kernels::cuda {

struct AllocatorStats {
  int64_t device_mallocs = 0;  // cudaMalloc calls so far
  int64_t bytes_in_use = 0;    // size-class bytes held by live tensors
  int64_t bytes_cached = 0;    // bytes on the free lists
  int64_t peak_in_use = 0;
  int64_t hits = 0;              // allocations served from a free list
  int64_t graph_pool_bytes = 0;  // bytes reserved by the graph pool (never released)
};

// The size class of a request of `bytes` (what is actually reserved).
size_t allocation_size_class(size_t bytes);

// The process-wide caching allocator (never destroyed, so tensors released at exit stay valid). Its
// allocate() serves the ordinal it is given (Tensor::empty(..., Device::cuda[, index]): the calling
// thread's current device unless an ordinal is named).
DeviceAllocator& caching_allocator();
// A CUDA tensor on device `device` (an ordinal in [0, device_count())), from that device's free lists
// (installs the allocator first; Tensor::empty with that ordinal). The current device is unchanged.
Tensor empty_on_device(const Shape& shape, DType dtype, int device);
// The ordinal of the device a pointer's memory lives on (cudaPointerGetAttributes; device memory only).
// A tensor carries its own (Tensor::device_index()); this is the memory's word, for checks.
int pointer_device(const void* p);
AllocatorStats allocator_stats();
// cudaFree's every cached block (live blocks are untouched).
void release_cached_memory();

}  // namespace dsaserve::kernels::cuda
