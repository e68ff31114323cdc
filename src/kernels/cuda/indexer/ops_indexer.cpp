// Host wrappers of the indexer operators (ops.h indexer_topk and its rows form). Over kernel-format key
// caches (bf16 or FP8) they run the sm_90a kernels (indexer_kernels.h); over f32 caches the plain kernels
// of indexer.cu.
#include <algorithm>

#include "kernels/cuda/attention/attention_params.h"
#include "kernels/cuda/common/views.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/indexer/indexer_kernels.h"

namespace dsaserve::kernels::cuda {

Tensor indexer_topk(const Tensor& q, const Tensor& w, const PagedSeq& keys, int64_t start_pos, int64_t topk,
                    double scale, double weight_scale, const KernelOptions& o) {
  if (keys.cache.defined() && keys.cache.dtype() != DType::f32) {  // bf16 or FP8 u8 [slots, 132]
    return indexer_topk_sm90(q, w, keys, start_pos, topk, scale, weight_scale, o);
  }
  const Rows3View qv = rows3_f32(q, "indexer q");
  const RowView wv = rows_f32(w, "indexer weights");
  const int64_t T = qv.n0, ih = qv.n1, id = qv.n2;
  DSA_CHECK(wv.rows == T && wv.cols == ih, "indexer: weights {} should be [{}, {}]", w.describe(), T, ih);
  DSA_CHECK(topk > 0 && start_pos >= 0, "indexer: topk {} and start position {} must be positive", topk,
            start_pos);
  const RowView c = rows_f32(keys.cache, "indexer key cache");
  DSA_CHECK(c.cols == id, "indexer: key cache rows of {} values, queries of {}", c.cols, id);
  const int64_t S = start_pos + T;
  check_pages(keys, S, c.rows, "indexer keys");
  const int64_t kout = std::min(topk, S);
  Tensor out = Tensor::empty({T, kout}, DType::i32, Device::cuda);
  if (T == 0) return out;
  Tensor score = Tensor::empty({T, S}, DType::f32, Device::cuda);
  IndexerScoreParams sp{qv.p,
                        wv.p,
                        c.p,
                        i32_vec(keys.page_table, "indexer page table"),
                        score.data<float>(),
                        T,
                        ih,
                        id,
                        qv.s0,
                        qv.s1,
                        wv.stride,
                        c.stride,
                        keys.page_size,
                        c.rows,
                        start_pos,
                        float(scale),
                        float(weight_scale)};
  check_launch(launch_indexer_scores(sp, op_stream()), "indexer scores");
  check_launch(launch_indexer_topk({score.data<float>(), out.data<int32_t>(), T, S, topk, kout, start_pos},
                                   op_stream()),
               "indexer top-k");
  return out;
}

Tensor indexer_topk_batch(const Tensor& q, const Tensor& w, const PagedRows& keys, int64_t topk, double scale,
                          double weight_scale, const KernelOptions& o) {
  return indexer_topk_rows(q, w, keys.cache, keys.page_table, keys.page_size, keys.row_seq, keys.row_len,
                           keys.max_len, topk, scale, weight_scale, op_stream(), keys.len_host,
                           kIndexerScoreBudgetBytes, o, keys.indexer_plan);
}

}  // namespace dsaserve::kernels::cuda
