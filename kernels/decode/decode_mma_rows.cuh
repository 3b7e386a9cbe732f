#pragma once
// The query rows a lane of the tensor-core decode kernels (decode_split_kv_mma.cuh,
// decode_latent_mma.cuh) holds in its mma fragments - rows g and g + 8 of the block's 16, g = lane / 4
// - with what each needs to score a key: its visible keys, query index, aligned position and head's
// modifiers; the score rule itself; and the staging of the block's 16 Q rows, one for both kernels.
#include <cmath>
#include <cstdint>

#include "../common/causal_mask.cuh"
#include "../common/primitives.cuh"
#include "../common/score_mods.cuh"
#include "kv_cache_params.h"
#include "new_rows.cuh"

SELFATTN_KERNELS_BEGIN

struct DecodeMmaRows {
  KeyRange visible[2];  // rows past the group see no key
  int query_row[2], aligned[2];
  HeadScoreMods head_mods[2];
};

// Rows row0 + g and row0 + g + 8 of the (sequence b, kv head) group of group_rows = heads_per_kv x
// seq_q rows (row r: head kv_head * heads_per_kv + r / seq_q, new row r % seq_q).
__device__ inline DecodeMmaRows decode_mma_rows(const DecodeSplitKvParams& p, const SequenceKeys& sequence, int b,
                                                int kv_head, int row0, int group_rows, int seq_q) {
  const int g = int(threadIdx.x) % 32 / 4;
  DecodeMmaRows rows;
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + g + 8 * h;
    rows.query_row[h] = row % seq_q;
    rows.visible[h] = row < group_rows ? visible_key_range(rows.query_row[h], sequence, p.causal, p.mods.window_left,
                                                           p.mods.window_right)
                                       : KeyRange{0, 0};
    rows.aligned[h] = aligned_key(rows.query_row[h], sequence);
    rows.head_mods[h] = head_score_mods(p.mods, b, kv_head * p.heads_per_kv + (row < group_rows ? row / seq_q : 0));
  }
  return rows;
}

// Row h's score of `key` from its dot product, in log2 units (the softmax scale and the modifiers
// applied); -inf for a key at or past key_end or outside the row's visible keys.
__device__ inline float decode_mma_score(const DecodeSplitKvParams& p, const DecodeMmaRows& rows, int h, int key,
                                         int key_end, float dot) {
  if (key >= key_end || key < rows.visible[h].begin || key >= rows.visible[h].end) return -INFINITY;
  return p.mods.changes_values ? modified_score(p.mods, rows.head_mods[h], dot * p.scale, rows.query_row[h],
                                                rows.aligned[h], key) * kLog2e
                               : dot * p.scale_log2;
}

// Stages the group's Q rows row0 .. row0 + 15 (row r: head kv_head * heads_per_kv + r / seq_q,
// new row r % seq_q of the sequence's `rows`) into q_s [16][LD] as Dim values each, 16-byte chunks
// (the host checked q's rows are on 16 bytes); rows past the group are zeros. No barrier: the
// caller's first one publishes them.
template <int Dim, int LD, int Threads, class T>
__device__ inline void decode_mma_stage_q(const DecodeSplitKvParams& p, const SequenceRows& rows, T* q_s, int kv_head,
                                          int row0, int group_rows, int seq_q) {
  constexpr int kChunks = Dim / 8;  // 8 elements (16 bytes of T) each
  const T* q = static_cast<const T*>(p.q);
  for (int i = threadIdx.x; i < 16 * kChunks; i += Threads) {
    const int r = i / kChunks, c = (i % kChunks) * 8, row = row0 + r;
    uint4 chunk = make_uint4(0, 0, 0, 0);
    if (row < group_rows) {
      const int head = kv_head * p.heads_per_kv + row / seq_q;
      chunk = load_vector(reinterpret_cast<const uint4*>(q + int64_t(rows.entry) * p.q_stride_batch +
                                                         int64_t(head) * p.q_stride_head +
                                                         int64_t(rows.first + row % seq_q) * p.q_stride_row + c));
    }
    store_vector(reinterpret_cast<uint4*>(q_s + r * LD + c), chunk);
  }
}

SELFATTN_KERNELS_END
