#pragma once
// Plain parameters of the lightning indexer kernels: the FP8 index-key store (sm90_indexer_cache.cu), the
// scores and the fused launch (sm90_indexer_topk.cu) and the exact top-k select (sm90_indexer_select.cu).
//
// For query row r (one decode token of a request, or one prefill token) with n = row_len[r] visible
// keys: score[s] = sum_h w[r,h] * weight_scale * relu(scale * q[r,h] . k[s]) for s < n, keys read
// from the paged indexer K cache. The output row holds the top `topk` positions (ties toward the lower
// position), ascending; rows with n <= topk list 0..n-1 and pad with -1.
//
// Index-key cache formats (slot = page_table[pos / page_size] * page_size + pos % page_size):
//   bf16: [num_slots, 128] bf16, one row per slot.
//   fp8:  a u8 tensor [num_slots, 132] holding num_slots * 132 bytes, laid out as two arrays (not one row
//         per slot, so that every row of codes is 128-byte aligned): codes [num_slots, 128] e4m3 at byte 0,
//         then scales [num_slots] f32 at byte num_slots * 128. key[s][d] = e4m3(code[s][d]) * scale[s];
//         scale = amax(|k[s]|) / 448, or 1 when that is not positive (all zeros, or an f32-subnormal amax
//         whose quotient underflows); code = e4m3_satfinite(k / scale), round to nearest even.
//
// Scores: tensor cores, a tile of 128 keys times all heads per warp step, fp32 accumulation. bf16 keys: q
// rounded to bf16. FP8 keys go into the MMA as their exact e4m3 values and each key's scale multiplies its
// dot products afterwards: relu(scale * k_scale * (q . code)). Three score kernels (IndexerScoreKernel):
// v1 rounds q to bf16 and widens the codes to bf16 (e4m3 -> bf16 is exact); v2 gives FP8 keys f16 MMAs: codes
// e4m3 -> f16 (exact, one cvt per two codes), each head of q scaled by a power of two (its amax into [2^14,
// 2^15)) and rounded to f16, the power of two folded into that head's weight (relu commutes with a positive
// scale); v3 (the default) is v2 with FP8 keys through wgmma. v2's and v3's bf16 scores equal v1's bit for
// bit (same MMAs in the same order). Page sizes must fit in 31 bits.
//
// Select: the score kernel writes the f32 scores and, fused, a 2048-bin histogram of their top 11
// order-preserving bits (digit 1). Four passes follow. With splits == 1 (many rows, or short ones) one CTA
// per row runs them all in shared memory. Otherwise each pass is a grid of rows x splits CTAs (CTA j of a
// row takes keys [j * split_len, (j + 1) * split_len)) merging through global memory:
//   1. resolve digit 1 (the bin holding the k-th largest key), histogram digit 2 (bits 20..10) of its keys;
//   2. resolve digit 2, histogram digit 3 (bits 9..0);
//   3. resolve digit 3: tau, the exact k-th largest key, and take_eq, how many keys equal to tau to take
//      (the lowest positions first); count each CTA's keys > tau and == tau;
//   4. each CTA adds the counts of the CTAs before it and writes its selected positions in order.
// By default the four passes run as one cooperative launch with grid barriers between them (splits > 1),
// or inside the score kernel (splits == 1): IndexerSelectPath below. Launch sizes depend only on (rows,
// max_len) and the device, never on row contents (CUDA-graph safe; the packed score buffer below is sized by
// the caller from the row lengths, the dense one by rows x max_len).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kernel_options.h"

namespace dsaserve::kernels::cuda {

inline constexpr int kIndexerDim = 128;        // index_head_dim
inline constexpr int kIndexerHistBins = 2048;  // first radix digit: 11 bits
// Histogram words per row: digit 1 (2048 bins, bits 31..21), digit 2 (2048, bits 20..10), digit 3 (1024).
inline constexpr int kIndexerHistWords = 2048 + 2048 + 1024;
// Row stride of the histogram workspace: digit 1 only when one CTA per row selects in shared memory.
__host__ __device__ constexpr int64_t indexer_hist_stride(int64_t splits) {
  return splits > 1 ? kIndexerHistWords : kIndexerHistBins;
}
inline constexpr int kIndexerFp8RowBytes = kIndexerDim + 4;  // 128 codes + one f32 scale per token

enum class IndexerKeyFormat : int { bf16 = 0, fp8_e4m3 = 1 };

// cache[slots[i]] = src[i] quantised to the FP8 index-key format above (one warp per row).
struct IndexerKeyStoreParams {
  const float* src;      // [n, 128] f32, row stride src_stride (elements), not null
  const int32_t* slots;  // [n] i32 slot per row, not null; slots outside [0, num_slots) are skipped
  void* cache;           // FP8 index-key cache of num_slots slots (num_slots * 132 bytes), not null
  int64_t n, src_stride, num_slots;
};
cudaError_t launch_indexer_key_store(const IndexerKeyStoreParams& p, cudaStream_t stream);

// out[i] = the cached key of position i as f32, through the page table (the per-request gather).
struct IndexerKeyGatherParams {
  const void* cache;          // index-key cache of num_slots slots in `format`, not null
  const int32_t* page_table;  // [ceil(n / page_size)] i32 pages (range-checked by the host), not null
  float* out;                 // [n, 128] f32 contiguous, not null
  int64_t n, page_size, num_slots;
  IndexerKeyFormat format;
};
cudaError_t launch_indexer_key_gather(const IndexerKeyGatherParams& p, cudaStream_t stream);

// Per-row results of the select passes, written by CTA 0 of the row in pass 1..3 (read by later passes).
struct IndexerSelectState {
  uint32_t b1, above1;       // pass 1: digit 1, keys in higher digit-1 bins
  uint32_t prefix2, above2;  // pass 2: digits 1-2, keys with a higher 22-bit prefix
  uint32_t tau, take_eq;     // pass 3: the k-th largest key, keys equal to it to take
  uint32_t pad[2];
};

// How the select runs (IndexerSelectPath, kernels/kernel_options.h; every path gives the same output).
// With splits == 1: row, the row select kernel (a second launch, programmatic dependent of the score
// kernel); row_fused, no second launch: the score kernel's CTAs count themselves done per row (a counter in
// the workspace, zeroed with the histograms) and the last CTA of each row runs that row's select (256
// threads) once the others' scores and histogram atomics are visible (threadfence before the count, L2
// loads after). With splits > 1: passes, the four passes as four dependent launches (grid rows x splits);
// cooperative, the same four passes in one cooperative launch (grid min(rows x splits, co-resident CTAs
// from the occupancy API), each CTA loops over (row, split) pairs, grid barriers between the passes).
// automatic: the two constants below.
//
// The default with splits > 1: the four launches. Measured on the H200 the cooperative launch was no
// faster (batch 1 x 128K: select 24.7 us cooperative vs 23.8 us in four launches; batch 64: 74.4 vs 71.5).
inline constexpr IndexerSelectPath kIndexerSelectPathDefault = IndexerSelectPath::passes;
// The default with splits == 1. Revert to the select kernel with one line: IndexerSelectPath::row.
inline constexpr IndexerSelectPath kIndexerRowSelectDefault = IndexerSelectPath::row_fused;
// The row select (splits == 1) is launched as a programmatic dependent of the score kernel (its launch
// overlaps the score grid's tail). false: an ordinary launch.
inline constexpr bool kIndexerSelectRowPdl = true;
// With packed scores the score kernel is launched as a programmatic dependent of the offsets kernel
// (which triggers at once; the score kernel waits before reading the offsets). false: an ordinary launch.
inline constexpr bool kIndexerScorePdl = true;

// The score kernel p's launch runs: select_indexer_score_kernel (kernels/kernel_options.h) of p.score_kernel
// and the key format.
struct IndexerTopkParams;
IndexerScoreKernel indexer_score_kernel(const IndexerTopkParams& p);

struct IndexerTopkParams {
  const float* q;             // [rows, heads, 128] f32, strides q_s0, q_s1 (elements), not null
  const float* w;             // [rows, heads] f32, row stride w_s0, not null
  const void* cache;          // index-key cache of num_slots slots in `key_format` (see above), not null
  const int32_t* page_table;  // [num_seqs, pt_stride] i32, not null
  const int32_t* row_seq;     // [rows] i32 sequence (page-table row) of each query row; null: r -> r
  const int32_t* row_len;     // [rows] i32 visible keys of each row, not null
  float* scores;  // f32 workspace (16-byte aligned), not null: dense [rows, score_stride] (score_stride >=
                  // max_len, a multiple of 4), or packed when score_offsets is set
  int64_t* score_offsets;  // [rows] i64 workspace, or null (dense). Set: the launch computes on the device
                           // each row's offset in `scores`, packing only the rows with more than topk keys
                           // (row_len rounded up to 4 floats each); scores then needs
                           // indexer_packed_score_elems(row lengths) floats
  uint32_t* hist;  // [rows, indexer_hist_stride(splits)] u32 workspace (the digits' histograms), zeroed by
                   // the launch
  IndexerSelectState* state;  // [rows] workspace; splits == 1: may be null
  uint32_t* counts;           // [rows, splits, 2] u32 workspace: keys > tau, keys == tau of each CTA; splits
                              // == 1: may be null
  uint32_t* row_done;         // [rows] u32 workspace (splits == 1): score CTAs done per row (row_fused),
                              // zeroed by the launch with the histograms; splits > 1: may be null
  int32_t* out;               // [rows, out_stride] i32, out_k columns written, not null
  int64_t rows, heads;        // heads: 32 or 64
  int64_t q_s0, q_s1, w_s0;
  int64_t num_seqs, pt_cols, pt_stride;  // page table rows, pages per row, row stride
  int64_t page_size, num_slots;
  int64_t score_stride, out_stride, out_k;  // out_k = min(topk, max_len)
  int64_t topk;
  int64_t max_len;  // host bound on row_len (sizes the grids)
  int64_t splits;   // select CTAs per row (indexer_select_splits); split_len keys each
  int64_t split_len;
  float scale, weight_scale;
  IndexerKeyFormat key_format;
  bool scores_only;                 // benchmarks: run only the score kernel (the selection is not written)
  IndexerSelectPath select_path;    // KernelOptions::indexer_select (automatic: zero)
  IndexerScoreKernel score_kernel;  // KernelOptions::indexer_score (automatic: zero)
  // KernelOptions::pdl (common/pdl.cuh): the select passes (splits > 1) as programmatic dependent launches.
  // The row select and, with packed scores, the score kernel are programmatic whatever it says
  // (kIndexerSelectRowPdl, kIndexerScorePdl); the offsets kernel and the workspace memset never are.
  bool pdl = false;
};

// The path p's select takes. splits == 1: row_fused when asked (or by default), max_len > topk and not
// scores_only, else row. splits > 1: cooperative when asked (or by default), the device supports
// cooperative launches and max_len > topk, else passes. Forced paths of the other kind mean the default.
IndexerSelectPath indexer_select_path(const IndexerTopkParams& p);
// "row", "row_fused", "passes", "coop" or "auto".
const char* indexer_select_path_name(IndexerSelectPath path);
// CTAs of the cooperative select grid for p: min(rows x splits, SMs x co-resident CTAs per SM).
int64_t indexer_select_coop_grid(const IndexerTopkParams& p);
// Co-resident CTAs of the cooperative select kernel on the current device (0: no cooperative launch);
// computed once.
int indexer_select_coop_capacity();

// Select CTAs per row for (rows, max_len), and in *split_len the keys of each (a multiple of 16384,
// splits * split_len >= max_len): a pure function of its inputs and the SM count, never of row contents.
int64_t indexer_select_splits(int64_t rows, int64_t max_len, int num_sms, int64_t* split_len);
// u32 words of the select workspace: hist [rows, indexer_hist_stride(splits)], then splits == 1: row_done
// [rows]; splits > 1: state [rows] (8 words each) and counts [rows, splits, 2]. indexer_workspace_pointers
// lays them out; the first indexer_zeroed_words of them are zeroed by each launch.
int64_t indexer_zeroed_words(int64_t rows, int64_t splits);
int64_t indexer_workspace_words(int64_t rows, int64_t splits);
// Sets p.hist, p.row_done, p.state and p.counts inside `words` (indexer_workspace_words(p.rows, p.splits) of
// them).
void indexer_workspace_pointers(IndexerTopkParams& p, uint32_t* words);
// The SM count of the current device (132 when it cannot be read).
int indexer_num_sms();

// Floats of the packed score buffer for these row lengths: sum over rows with n > topk of n rounded up to 4.
inline int64_t indexer_packed_score_elems(const int32_t* row_len, int64_t rows, int64_t topk) {
  int64_t s = 0;
  for (int64_t r = 0; r < rows; ++r) s += row_len[r] > topk ? (int64_t(row_len[r]) + 3) / 4 * 4 : 0;
  return s;
}

// Zeroes the histograms, (packed scores) computes the row offsets, then runs the score kernel and the
// select passes on `stream`.
cudaError_t launch_indexer_topk_fused(const IndexerTopkParams& p, cudaStream_t stream);
// The four select passes alone (after the score kernel has written scores and digit 1).
cudaError_t launch_indexer_select(const IndexerTopkParams& p, cudaStream_t stream);
// p.score_offsets[r] = the packed offset of row r (one CTA scans row_len; rows naming no valid sequence
// count as empty). Part of launch_indexer_topk_fused.
cudaError_t launch_indexer_score_offsets(const IndexerTopkParams& p, cudaStream_t stream);

// The scores of row r.
__host__ __device__ inline float* indexer_row_scores(const IndexerTopkParams& p, int64_t r) {
  return p.scores + (p.score_offsets ? p.score_offsets[r] : r * p.score_stride);
}

}  // namespace dsaserve::kernels::cuda
