#pragma once
// Programmatic dependent launch (PDL, sm_90), the device side. The host side is launch_util.cuh's
// launch_pdl; KernelOptions::pdl (--pdl) turns it on for the kernels of a step, each launcher passing its
// params' `pdl` field.
//
// A kernel launched as a programmatic dependent may start while the grid before it in the stream still
// runs. The rule every such kernel keeps: it executes pdl_wait() on every path, including early returns,
// before it reads anything an earlier kernel wrote and before it writes global memory (an earlier kernel
// may still read a buffer it overwrites). Only reads of immutable data (weights, scales, constant tables)
// and prefetch hints (prefetch_l2) may come first. Then its own completion implies the completion of every
// grid before it, so the next kernel's wait covers them all. The kernels here put pdl_enter() first: the
// wait, then launch_dependents, so the next grid's CTAs can become resident (and run their prologue) while
// this one runs; they wait for this grid's completion before touching its results.
//
// In a kernel launched the ordinary way both instructions are no-ops.
namespace dsaserve::kernels::cuda {

// griddepcontrol.wait: returns once the grids this one depends on have completed and their writes are
// visible.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// griddepcontrol.launch_dependents: a programmatically launched next grid may be scheduled once every CTA
// of this grid has executed this or exited (later calls are no-ops).
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
}

// The top of a kernel that may be launched programmatically: wait for the grids before it, then let the
// next grid be scheduled.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_launch_dependents();
}

// A hint to bring the 128-byte line holding p into L2. Allowed before pdl_wait() at any address: L2 is
// the point of coherence of the GPU's global memory (SM writes land there; cp.async.cg and ld.global.cg
// read there), so a line fetched early and written afterwards by an earlier kernel is read with that
// write after the wait. For weights: their first tiles stream in while the previous kernel drains.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

}  // namespace dsaserve::kernels::cuda
