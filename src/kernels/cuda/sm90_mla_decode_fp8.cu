// Sparse MLA decode, FP8 (e4m3, 656-byte rows) latent cache: instantiations for head groups of 16 and 64.
#include "kernels/cuda/sm90_mla_decode.cuh"

namespace dsaserve::kernels::cuda::mla_detail {

cudaError_t launch_decode_fp8(const MlaDecodeParams& p, cudaStream_t stream) {
  return p.heads <= 16 ? launch_decode_kernel<1, true>(p, stream) : launch_decode_kernel<4, true>(p, stream);
}

}  // namespace dsaserve::kernels::cuda::mla_detail
