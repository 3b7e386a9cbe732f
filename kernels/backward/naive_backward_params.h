#pragma once
// Parameters of the naive and cublas backward paths' own kernels (kernels/backward/), beside the
// forward's QkParams / PvParams (naive_params.h), which the naive backward reuses for S = Q K^T,
// dP = dO V^T and dQ = dS K. Plain data, the same for nvcc and the host compiler.
//
// Like the forward's kernels they see one CHUNK: `bh_count` consecutive (batch, head) pairs from
// flat index bh_begin (= batch * heads + head) x `rows` consecutive query rows from row_begin. The
// chunk's score rows live in the workspace as [bh - bh_begin][row - row_begin][key].
#include <cstddef>
#include <cstdint>

#include "../launch.h"
#include "../unfused/naive_params.h"
#include "../params.h"

namespace selfattn::kernels {

// From the recomputed S = Q K^T (unscaled) and dP = dO V^T (both fp32, one layout) to
//   P_ij  = exp(x_ij - lse_i),  x_ij = mods(scale * S_ij)         (0 outside the row's visible keys)
//   dS_ij = scale * P_ij (dP_ij - D_i) * (1 - tanh^2(scale S_ij / softcap))   (the factor only with softcap)
// i.e. dS already carries the scale and the softcap factor: dQ = dS K and dK = dS^T Q need nothing
// more. P and dS (element type the kernel's template argument) may be written over S and dP.
// Every key [0, seq_k) of every chunk row is written; only visible keys of S and dP are read.
// With dropout (common/dropout.cuh; mask M, rate p) P is written as P M / (1 - p), what dV = P^T dO
// takes, and dS takes dP M / (1 - p) (with the undropped P in front).
struct BackwardScoresParams {
  const float* s;
  const float* dp;
  void* p;
  void* ds;
  int64_t s_bh_stride, s_row_stride;  // of S and of dP (elements)
  int64_t p_bh_stride, p_row_stride;  // of P and of dS (elements of their type)
  const float* lse;                   // lse[bh * lse_pair_stride + query] (the forward's)
  const float* d;                     // D in the LSE's layout
  int64_t lse_pair_stride;
  KeyMask mask;
  ScoreMods mods;
  float scale;
  int heads;
  int bh_begin, row_begin, rows;
  int seq_k;
};

// accumulator[kv][key][c] += sum over the chunk's heads bh of kv pair `kv` (GQA: bh / heads_per_kv
// == kv) and the chunk's rows i of scores[bh][i][key] * rows_of[bh][i][c]:
//   dV += P^T dO   (scores = P,  rows_of = dO)
//   dK += dS^T Q   (scores = dS, rows_of = Q)
// kv is the flat kv pair batch * kv_heads + kv_head; the accumulator's element (kv, key, c) is at
// kv * acc_kv_stride + key * head_dim + c. Every element is owned by one block of one launch (the
// reduction over rows and the group's heads runs inside the block), so no atomics: deterministic.
// Grid: x = head_dim tiles, y = key tiles, z = the kv pairs the chunk touches, from bh_begin / heads_per_kv.
struct GradKvParams {
  const float* scores;
  int64_t scores_bh_stride, scores_row_stride;
  HeadsView rows_of;  // query-head rows (q or dout)
  float* accumulator;
  int64_t acc_kv_stride;
  int heads, heads_per_kv;
  int bh_begin, bh_count, row_begin, rows;
  int seq_k, head_dim;
  KeyMask mask;  // rows that see none of a key tile are skipped
};

}  // namespace selfattn::kernels
