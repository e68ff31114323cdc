#pragma once
// Host-side launch helpers shared by the .cu files: kernel launches that carry a launch attribute
// (programmatic dependent launch, cooperative launch) through cudaLaunchKernelEx.
#include <cuda_runtime.h>

#include <cstddef>

namespace dsaserve::kernels::cuda {

// kernel<<<grid, block, smem, stream>>>(args...) through cudaLaunchKernelEx with the one launch attribute
// `attr`. Returns cudaLaunchKernelEx's error as it is (nothing is retried or cleared).
template <typename... Params, typename... Args>
cudaError_t launch_with_attribute(const cudaLaunchAttribute& attr, void (*kernel)(Params...), dim3 grid,
                                  dim3 block, size_t smem, cudaStream_t stream, const Args&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[1] = {attr};
  cfg.attrs = attrs;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// kernel<<<grid, block, smem, stream>>>(args...), with `programmatic` as a programmatic dependent launch
// (PDL, cudaLaunchAttributeProgrammaticStreamSerialization): the kernel may start while the previous grid
// in `stream` drains, so it must griddepcontrol.wait before reading that grid's results (a no-op in an
// ordinary launch). Where the programmatic launch fails (a driver or context without it), its error is
// cleared and the kernel is launched the ordinary way, except while `stream` is being captured (the failed
// launch has invalidated the capture: its error is returned as it is); programmatic = false launches only
// the ordinary way. Returns cudaSuccess, or the error.
template <typename... Params, typename... Args>
cudaError_t launch_pdl(bool programmatic, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, const Args&... args) {
  if (programmatic) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    const cudaError_t e = launch_with_attribute(attr, kernel, grid, block, smem, stream, args...);
    if (e == cudaSuccess) return cudaSuccess;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone)
      return e;
    (void)cudaGetLastError();  // no programmatic launch here: an ordinary one
  }
  kernel<<<grid, block, smem, stream>>>(args...);
  return cudaGetLastError();
}

}  // namespace dsaserve::kernels::cuda
