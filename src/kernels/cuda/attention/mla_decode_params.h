#pragma once
// Plain parameters of the sparse MLA decode kernels (sm90_mla_decode*.cu): the absorbed (MQA) form of
// MLA attention over a paged latent cache of 576 values per token (512 kv latent + 64 rotated rope key).
//
// Work is organised in query rows: a decode batch has one row per request; a prefill chunk of one
// request may be given as one row per token (each row names its own visible length). All heads of a row
// share every KV read: a block loads a tile of latent rows once into shared memory and runs every head of
// its head group (up to 64) against it on the tensor cores (mma.sync bf16, fp32 accumulation).
//
// Latent cache layouts (one row per token slot; slot = page_table[pos / page_size] * page_size + pos %
// page_size):
//   bf16: [slots, 576] bf16 (1152 bytes a row).
//   fp8:  [slots, 656] bytes: 512 e4m3 latent values, 4 f32 scales (one per 128 values; value = code *
//         scale), 64 bf16 rope values (FlashMLA's 656-byte layout).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kernel_options.h"

namespace dsaserve::kernels::cuda {

inline constexpr int kMlaLatent = 512;  // kv_lora_rank
inline constexpr int kMlaRope = 64;     // qk_rope_head_dim
inline constexpr int kMlaDim = kMlaLatent + kMlaRope;
inline constexpr int kMlaBf16RowBytes = kMlaDim * 2;                       // 1152
inline constexpr int kMlaFp8RowBytes = kMlaLatent + 4 * 4 + kMlaRope * 2;  // 656

enum class MlaKvFormat : int { bf16 = 0, fp8_e4m3 = 1 };

// cache[slots[i]] = src[i] converted to the cache format (fp8: per-128-value scale = max|x| / 448).
struct MlaCacheStoreParams {
  const float* src;      // [n, 576] f32, row stride src_stride (elements), not null
  const int32_t* slots;  // [n] i32 slot per row, not null; slots outside [0, num_slots) are skipped
  void* cache;           // [num_slots, row_bytes] bytes in `format`, not null
  int64_t n, src_stride, num_slots;
  MlaKvFormat format;
};
cudaError_t launch_mla_cache_store(const MlaCacheStoreParams& p, cudaStream_t stream);

// out[i] = cache[slot of position i] as f32 (fp8 codes times their scale), i = 0..n-1, through the page
// table: slot = page_table[i / page_size] * page_size + i % page_size (the MHA form's latent gather).
struct MlaCacheGatherParams {
  const void* cache;          // [num_slots, row bytes] latent cache in `format`, not null
  const int32_t* page_table;  // [ceil(n / page_size)] i32 pages (range-checked by the host), not null
  float* out;                 // [n, 576] f32 contiguous, not null
  int64_t n, page_size, num_slots;
  MlaKvFormat format;
};
cudaError_t launch_mla_cache_gather(const MlaCacheGatherParams& p, cudaStream_t stream);

// The bf16 copy of an FP8 latent cache that prefill-sized launches read (select_mla_fp8_bf16_copy):
// sequence s's positions 0 .. seq_pages * page_size - 1, in its own pages s * seq_pages .. of `out`, each row
// dequantised exactly as kernel v5's producer does (bf16 of code x scale; rope copied), and the copy's
// page table out_page_table[s, i] = s * seq_pages + i. Rows of pages outside [0, num_slots / page_size) are
// zeros. One warp per row.
struct MlaCacheBf16CopyParams {
  const void* cache;          // [num_slots, 656] FP8 latent cache, not null
  const int32_t* page_table;  // [num_seqs, pt_stride] i32, not null
  void* out;                  // [num_seqs * seq_pages * page_size, 576] bf16, not null
  int32_t* out_page_table;    // [num_seqs, seq_pages] i32, not null
  int64_t num_seqs, pt_stride, seq_pages, page_size, num_slots;
  bool pdl = false;  // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
cudaError_t launch_mla_cache_bf16_copy(const MlaCacheBf16CopyParams& p, cudaStream_t stream);

// out[r, h, :] = sum_j softmax_j(scale * (q_lat[r,h] . kv_j + q_rope[r,h] . rope_j)) kv_j over the keys
// of row r: positions sel[r, 0..sel_k) (entries < 0 or >= row_len[r] are skipped) or, when sel is null,
// positions 0..row_len[r]-1. Rows without any key give zeros.
struct MlaDecodeParams {
  const float* q_lat;         // [rows, heads, 512] f32, strides ql_s0, ql_s1 (elements), not null
  const float* q_rope;        // [rows, heads, 64] f32, strides qr_s0, qr_s1, not null
  const void* cache;          // [num_slots, row bytes] latent cache in `format`, not null
  const int32_t* page_table;  // [num_seqs, pt_stride] i32 pages of each sequence, not null
  const int32_t* row_seq;     // [rows] i32 sequence (page-table row) of each query row; null: row r -> r
  const int32_t* row_len;     // [rows] i32 visible positions of each row, not null
  const int32_t* sel;         // [rows, sel_k] i32 selected positions, row stride sel_stride; null = dense
  float* out;                 // [rows, heads, 512] f32 contiguous, not null
  float* partial_out;         // [rows, splits, heads, 512] f32; needed when splits > 1, else may be null
  float* partial_lse;         // [rows, splits, heads] f32 (log2 domain); needed when splits > 1
  int64_t rows, heads;
  int64_t ql_s0, ql_s1, qr_s0, qr_s1;
  int64_t num_seqs, pt_cols, pt_stride;  // page table rows, pages per row, row stride
  int64_t page_size, num_slots;
  int64_t sel_k, sel_stride;
  int64_t max_keys;  // host bound on the keys of any row (sel_k, or max row_len): sizes the split
  int splits;        // key-range splits per row (grid.z); 1 writes `out` directly
  float scale;
  MlaKvFormat format;
  // The kernel and v5's order (KernelOptions; the launch runs select_mla_decode_kernel /
  // select_mla_v5_early of them and the shapes, kernels/kernel_options.h).
  MlaDecodeKernel kernel = MlaDecodeKernel::automatic;
  MlaV5Order v5_order = MlaV5Order::automatic;
  // v5 (64 heads a block) with more than 64 heads: a row's head groups on neighbouring blocks of grid.x
  // (KernelOptions::mla_head_groups_adjacent; v5_grid / v5_block in sm90_mla_decode.cuh), else on grid.y.
  bool head_groups_adjacent = true;
  // KernelOptions::pdl (common/pdl.cuh): the decode kernel as a programmatic dependent launch (the split
  // combine is one whatever it says: it follows the decode kernel of the same call).
  bool pdl = false;
};

// The kernel p's launch runs (select_mla_decode_kernel of p.kernel, heads, rows and the cache format).
MlaDecodeKernel mla_decode_kernel(const MlaDecodeParams& p);
// Number of key splits that fills the GPU for this many rows/heads/keys with the kernel `requested` selects
// (a pure function of its inputs and the SM count).
int mla_decode_splits(int64_t rows, int64_t heads, int64_t max_keys, int num_sms,
                      MlaDecodeKernel requested = MlaDecodeKernel::automatic);
// Runs the decode kernel and, when p.splits > 1, the combine kernel.
cudaError_t launch_mla_decode(const MlaDecodeParams& p, cudaStream_t stream);

}  // namespace dsaserve::kernels::cuda
