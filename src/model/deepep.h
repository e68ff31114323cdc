#pragma once
// DeepEP's dispatch and combine over the EP group, on host tensors (Gloo; the sharded forward's
// --moe-a2a-backend deepep, model/forward_dist.cpp): each (row, pick) pair of this rank's rows goes to the EP
// rank holding the picked expert, in row order per destination, with the expert (local to the receiver) and
// the routing weight; the receiver runs its experts on what it received; the weighted outputs go back the
// same way and are summed per row in f32.
//
// Two payloads (DeepepPayload):
// - fp8 (SGLang's default on FP8 block-scaled experts; SGLANG_DEEPEP_BF16_DISPATCH turns it off there): a
//   dispatched pair is its row's e4m3 codes [H] and one f32 scale per 128 columns [H / 128], quantised once
//   per row on the sender exactly as the experts' FP8 GEMMs quantise their input
//   (kernels::cpu::fp8_quantize_row128), then the expert (i32) and the weight (f32): H + H / 32 + 8 bytes;
//   the receiver hands the codes and scales to the experts (kernels::moe_experts' Fp8Act) and their
//   dequantised value as the input. The combine sends each pair's weighted output rounded to bf16 (DeepEP's
//   combine dtype): 2 H bytes.
// - activations: the rows as the model holds them (f32 on the CPU, the reference's numbers) and the
//   expert and weight, 4 H + 8 bytes; the combine in f32, 4 H bytes.
// Before the dispatch every rank sends every other the number of pairs it will send (ep_dispatch_layout: an
// all-to-all of one i64 per rank), the receive counts of the all-to-all-v.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "dist/communicator.h"
#include "kernels/ops.h"

namespace dsaserve::model {

enum class DeepepPayload : uint8_t { fp8, activations };

// Bytes of one dispatched pair and of one combined pair.
int64_t deepep_dispatch_row_bytes(DeepepPayload p, int64_t hidden);
int64_t deepep_combine_row_bytes(DeepepPayload p, int64_t hidden);

// What this rank received in a dispatch, and what its combine needs.
struct DeepepDispatched {
  Tensor x;           // f32 [R, H] the received rows (fp8: the codes' values, e4m3 x scale)
  kernels::Fp8Act q;  // fp8: codes u8 [R, H], scales f32 [H / 128, R] (rows R); empty otherwise
  Tensor ids;         // i32 [R, 1] the expert of each received pair, local to this rank
  Tensor weights;     // f32 [R, 1]
  // The sender's side: pairs sent to / received from each rank, and the sent pairs (r * k + j) in send order.
  std::vector<int64_t> send, recv, order;
  int64_t rows = 0, picks = 0, hidden = 0;  // this rank's rows, k, H
  DeepepPayload payload = DeepepPayload::activations;
};

// The dispatch of this rank's rows h f32 [n, H] (CPU) routed to ids i32 [n, k] (global experts, rank r
// holding [r El, (r + 1) El)) with weights f32 [n, k]; n may be 0 (ids, weights then undefined or empty).
// Collective over `ep`. Throws dsaserve::Error for an expert outside the group's, a received expert outside
// [0, El), or (fp8) H not a multiple of 128.
DeepepDispatched deepep_dispatch(dist::Communicator& ep, const Tensor& h, const Tensor& ids,
                                 const Tensor& weights, int64_t experts_per_rank, DeepepPayload payload);
// The combine: y f32 [R, H] (CPU) the weighted expert output of each received pair, back to their senders,
// -> f32 [n, H], row r the f32 sum of its k pairs' outputs. Collective over `ep`.
Tensor deepep_combine(dist::Communicator& ep, const DeepepDispatched& d, const Tensor& y);

}  // namespace dsaserve::model
