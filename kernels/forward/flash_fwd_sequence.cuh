#pragma once
// What both fused kernels need to know about one (batch, head) before touching data: where its
// rows start, how many queries and keys it has, and which keys each query row sees.
#include <cstdint>

#include "../common/causal_mask.cuh"
#include "../common/compat.h"
#include "flash_fwd_params.h"
#include "../common/score_mods.cuh"

// Loops over register fragments must be unrolled completely, or the fragment arrays they index
// move to local memory (nvcc). The host compiler (sim) does not need it.
#if SELFATTN_SIM
#define SELFATTN_FLASH_UNROLL
#else
#define SELFATTN_FLASH_UNROLL _Pragma("unroll")
#endif

SELFATTN_KERNELS_BEGIN

// The tensor-core kernels' element type for a library Element (f16 and bf16 only).
template <Element E>
struct FlashElement;
template <> struct FlashElement<Element::f16> { using Type = __half; };
template <> struct FlashElement<Element::bf16> { using Type = __nv_bfloat16; };

struct FlashSequence {
  int64_t q_row_start;  // first row of this sequence in q/out/lse (varlen packing), else 0
  int64_t k_row_start;
  int q_len;
  int k_len;  // keys [0, k_len) of the sequence's rows exist; those before keys.begin are padding
  SequenceKeys keys;
};

__host__ __device__ inline int32_t flash_clamp_row(int32_t row, int32_t low, int32_t high) {
  return row < low ? low : (row > high ? high : row);
}

__host__ __device__ inline FlashSequence flash_sequence(const FlashFwdParams& p, int batch) {
  FlashSequence s;
  if (p.cu_seqlens_q != nullptr) {
    // cu_seqlens are device data nobody checked: each sequence's rows are clamped into the views
    // ([0, total_q) of q/out/lse, [0, total_k) of k/v), so a wrong entry gives a wrong (possibly
    // empty) sequence but no access outside them.
    const int32_t q_begin = flash_clamp_row(p.cu_seqlens_q[batch], 0, p.total_q);
    const int32_t k_begin = flash_clamp_row(p.cu_seqlens_k[batch], 0, p.total_k);
    s.q_row_start = q_begin;
    s.q_len = flash_clamp_row(p.cu_seqlens_q[batch + 1], q_begin, p.total_q) - q_begin;
    s.k_row_start = k_begin;
    // key_lengths (FlashAttention's seqused_k): the keys a sequence uses among its rows.
    const int32_t k_rows = flash_clamp_row(p.cu_seqlens_k[batch + 1], k_begin, p.total_k) - k_begin;
    s.k_len = key_length(p.key_lengths, batch, k_rows);
  } else {
    s.q_row_start = 0;
    s.k_row_start = 0;
    s.q_len = p.seq_q;
    s.k_len = key_length(p.key_lengths, batch, p.seq_k);
  }
  s.keys = sequence_keys(s.q_len, s.k_len, p.causal, p.key_start, p.q_offset, batch);
  return s;
}

// Keys [begin, end) that row `row` of the sequence sees (causal mask, key start and length, window).
__host__ __device__ inline KeyRange flash_visible_keys(const FlashFwdParams& p, const FlashSequence& seq, int row) {
  return visible_key_range(row, seq.keys, p.causal, p.mods.window_left, p.mods.window_right);
}

// The keys a block of query rows [row0, row0 + rows) works on: tiles of tile_keys from first_tile
// to end_tile (exclusive) cover every key any of its rows sees; keys in [unmasked.begin,
// unmasked.end) are seen by every row, so a tile inside that range needs no mask.
struct FlashBlockKeys {
  int first_tile, end_tile;
  KeyRange unmasked;
};
__host__ __device__ inline FlashBlockKeys flash_block_keys(const FlashFwdParams& p, const FlashSequence& seq, int row0,
                                                           int rows, int tile_keys) {
  const KeyRange first = flash_visible_keys(p, seq, row0);
  const KeyRange last = flash_visible_keys(p, seq, row0 + rows - 1);
  FlashBlockKeys keys;
  keys.first_tile = first.begin / tile_keys;
  keys.end_tile = (last.end + tile_keys - 1) / tile_keys;
  if (keys.end_tile < keys.first_tile) keys.end_tile = keys.first_tile;
  keys.unmasked = {last.begin, first.end};
  return keys;
}

// Whether the tile of keys [key0, key0 + tile_keys) is entirely seen by every row of the block.
__host__ __device__ inline bool flash_tile_unmasked(const FlashBlockKeys& keys, int key0, int tile_keys) {
  return key0 >= keys.unmasked.begin && key0 + tile_keys <= keys.unmasked.end;
}

SELFATTN_KERNELS_END
