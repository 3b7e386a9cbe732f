#pragma once
// Parameters of the three kernels of the naive path (Q K^T, scale+mask+softmax, P V); the cublas
// path shares the softmax. Plain data: the same layout for nvcc and the host compiler.
//
// All three see one CHUNK of the problem: `bh_count` consecutive (batch, head) pairs starting at flat
// index bh_begin (= batch * heads + head), and `rows` consecutive query rows starting at row_begin.
// S and P are the chunk's fp32 scores / probabilities in the workspace:
//   S[bh - bh_begin][row - row_begin][key], row stride s_row_stride, pair stride s_bh_stride.
// Strides of q/k/v/out are in elements (64-bit, from TensorView); head_dim's stride is 1.
#include <cstdint>

#include "../launch.h"
#include "../params.h"

namespace selfattn::kernels {

// Q/K/V/out of one call, shared by the kernels that read or write them.
struct HeadsView {
  const void* data;
  int64_t stride_batch, stride_head, stride_seq;
};

// Which keys each query row sees (visible_key_range() in attention_heads.cuh). Softmax applies it;
// Q K^T and P V use it to skip key tiles that no row of a tile sees.
struct KeyMask {
  const int32_t* key_lengths;  // [batch] or null
  const int32_t* key_start;    // [batch] or null: keys before it are padding (sequence_keys())
  const int32_t* q_offset;     // [batch] or null: row 0's position, counted from key_start
  CausalMask causal;
  int seq_q;                   // of the whole call (rows are chunk-relative + row_begin)
  int window_left, window_right;  // sliding window (ScoreMods); -1 unbounded
};

// S = Q K^T (unscaled) for the chunk; key tiles no row of the tile sees are skipped (left unwritten).
struct QkParams {
  HeadsView q, k;
  float* s;
  int64_t s_bh_stride, s_row_stride;
  int heads;            // query heads; (batch, head) = divmod(bh, heads)
  int heads_per_kv;     // GQA: query head h reads kv head h / heads_per_kv
  int bh_begin, row_begin, rows;
  int seq_k, head_dim;
  KeyMask mask;
};

// P = softmax(scale * S + mask) per row, written over S (p == s) or to a separate buffer; the row's
// natural-log LSE when lse != nullptr. P's element type is the kernel's template argument.
struct SoftmaxParams {
  const float* s;
  void* p;
  int64_t s_bh_stride, s_row_stride;
  int64_t p_bh_stride, p_row_stride;  // elements of P's type
  float* lse;                         // lse[bh * lse_pair_stride + query], or null
  int64_t lse_pair_stride;            // seq_q for [batch, heads, seq_q]; total_q for a varlen sequence
  KeyMask mask;
  ScoreMods mods;  // softcap, ALiBi, bias (score_mods.cuh); the window is in mask
  float scale;
  int heads;
  int bh_begin, row_begin, rows;
  int seq_k;
  // attention_probabilities' form of dropout: a dropped probability is written negated (-P) and a
  // kept one as it is, unscaled, instead of 0 and P / (1 - p). Only read when dropout is on.
  bool dropout_signs;
};

// O = P V for the chunk, O in the output dtype and strides. P is fp32; keys past the last visible
// one of a row tile are skipped (their P is 0).
struct PvParams {
  const float* p;
  int64_t p_bh_stride, p_row_stride;
  HeadsView v;
  void* out;
  int64_t out_stride_batch, out_stride_head, out_stride_seq;
  int heads, heads_per_kv;
  int bh_begin, row_begin, rows;
  int seq_k, head_dim;
  KeyMask mask;
};

// What the registry hands the host for a naive-path kernel: the instance and its launch geometry
// (taken from the kernel's traits, so the host never repeats a tile size).
struct TiledKernel {
  KernelRef kernel;
  int tile_rows = 0;  // output rows per block (grid y)
  int tile_cols = 0;  // output columns per block (grid x): keys for Q K^T, head_dim for P V
  int threads = 0;
  size_t smem_bytes = 0;
};
struct SoftmaxKernel {
  KernelRef kernel;
  int rows_per_block = 0;  // grid x = ceil(rows / rows_per_block), grid y = (batch, head) pairs
  int threads = 0;
  size_t smem_bytes = 0;
};

}  // namespace selfattn::kernels
