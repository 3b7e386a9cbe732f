#pragma once
// Which keys one split of a split-KV decode block reads (decode_split_kv.cuh and its tensor-core
// twin share it): the keys any row of the call may see - the union of the rows' visible_key_range
// (causal_mask.cuh), so only the tiles inside a sliding window are read - cut into num_splits runs
// of whole key tiles. A split past the last tile (more splits than tiles, a length of 0, a window
// that leaves nothing) is empty: it writes LSE -inf and O = 0, which the combine weighs as nothing.
#include "../common/causal_mask.cuh"
#include "../common/compat.h"
#include "kv_cache_params.h"

SELFATTN_KERNELS_BEGIN

// Keys [begin, end) of split `split` over a sequence's keys (sequence_keys()), in tiles of `tile_keys`
// counted from the tile holding the first visible key. Both bounds of visible_key_range are
// non-decreasing in the row, so rows 0 and seq_q - 1 (the sequence's query rows, >= 1) bound every
// row of the block (each row still masks its own range).
__host__ __device__ inline KeyRange decode_split_keys(const DecodeSplitKvParams& p, const SequenceKeys& keys, int seq_q,
                                                      int split, int tile_keys) {
  const int begin = visible_key_range(0, keys, p.causal, p.mods.window_left, p.mods.window_right).begin;
  const int end = visible_key_range(seq_q - 1, keys, p.causal, p.mods.window_left, p.mods.window_right).end;
  const int first_tile = begin / tile_keys;
  const int tiles = end > begin ? (end + tile_keys - 1) / tile_keys - first_tile : 0;
  const int per_split = (tiles + p.num_splits - 1) / p.num_splits;
  // int64: split * per_split * tile_keys stays below the capacity only for the splits that are not empty.
  const int64_t split_begin = (int64_t(first_tile) + int64_t(split) * per_split) * tile_keys;
  const int64_t split_end = split_begin + int64_t(per_split) * tile_keys;
  KeyRange range;
  range.begin = split_begin < end ? int(split_begin) : end;
  range.end = split_end < end ? int(split_end) : end;
  return range;
}

SELFATTN_KERNELS_END
