#pragma once
// Parameters of the fused (flash-style) forward kernels: flash_fwd.cuh (tensor cores, f16/bf16)
// and flash_fwd_simt.cuh (exact fp32 arithmetic, any element type). Plain data, shared by nvcc and
// the host compiler; the host fills one and passes it by value.
//
// Addressing is uniform for padded and variable-length batches: element (b, h, row, d) of q lives at
//   q + b * q_stride_batch + h * q_stride_head + (q_row_start(b) + row) * q_stride_row + d
// where q_row_start(b) is cu_seqlens_q[b] for varlen calls (whose batch stride is then 0) and 0
// otherwise. k, v, out and lse (row stride 1) follow the same rule. All offsets are 64-bit.
#include <cstddef>
#include <cstdint>

#include "../launch.h"
#include "../params.h"

namespace selfattn::kernels {

struct FlashFwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;  // natural-log LSE per row; null: not written

  int64_t q_stride_batch, q_stride_head, q_stride_row;
  int64_t k_stride_batch, k_stride_head, k_stride_row;
  int64_t v_stride_batch, v_stride_head, v_stride_row;
  int64_t out_stride_batch, out_stride_head, out_stride_row;
  int64_t lse_stride_batch, lse_stride_head;

  const int32_t* key_lengths;   // [batch] or null: batch b sees keys [0, clamp(key_lengths[b], 0, seq_k))
                                // (varlen: of its own keys, seqused_k)
  // [batch] or null each (AttentionOptions::key_start, q_offset; sequence_keys() in causal_mask.cuh).
  const int32_t* key_start;
  const int32_t* q_offset;
  const int32_t* cu_seqlens_q;  // [batch + 1] or null (padded batch)
  const int32_t* cu_seqlens_k;  // [batch + 1]; set exactly when cu_seqlens_q is

  int seq_q, seq_k;  // padded batches: the lengths; varlen: unused (the cu_seqlens give them)
  int total_q, total_k;  // varlen: rows of the packed q/out and k/v views (cu_seqlens are clamped to them)
  int head_dim;      // the tensor-core kernel's instance fixes it; the SIMT kernel reads it
  int heads_per_kv_head;  // GQA group size: head h reads kv head h / heads_per_kv_head
  float scale_log2;       // softmax scale * log2(e): scores go straight into exp2
  float scale;            // the softmax scale itself: modifiers work on natural-log scores
  CausalMask causal;
  ScoreMods mods;         // sliding window, softcap, ALiBi, bias (score_mods.cuh)
};

// running_max_offsets.cuh: out[a][i] = max(in[a][0..i]) for a varlen call's q (a = 0) and k (a = 1)
// cu_seqlens, count = batch + 1 entries each; the fused kernels then read `out` as their cu_seqlens.
struct RunningMaxOffsetsParams {
  const int32_t* in[2];
  int32_t* out[2];
  int count;
};

// What the host needs to launch one instance: the kernel and the shape it was compiled for.
struct FlashFwdInstance {
  KernelRef kernel;
  int block_threads = 0;
  int block_rows = 0;  // query rows per block: grid.x = ceil(seq_q / block_rows)
  int block_keys = 0;  // keys per K/V tile (not used to launch: tests size calls around the tiles by it)
  size_t smem_bytes = 0;
};

}  // namespace selfattn::kernels
