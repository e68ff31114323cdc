// Sparse MLA decode, bf16 latent cache: instantiations for head groups of 16 and 64.
#include "kernels/cuda/sm90_mla_decode.cuh"

namespace dsaserve::kernels::cuda::mla_detail {

cudaError_t launch_decode_bf16(const MlaDecodeParams& p, cudaStream_t stream) {
  return p.heads <= 16 ? launch_decode_kernel<1, false>(p, stream)
                       : launch_decode_kernel<4, false>(p, stream);
}

}  // namespace dsaserve::kernels::cuda::mla_detail
