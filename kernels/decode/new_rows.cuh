#pragma once
// Where one sequence's new rows (query rows, appended tokens) sit in a dense or packed call
// (NewRows, kv_cache_params.h): the one place the KV-cache kernels turn (sequence, row) into a row
// of the views, with the packed offsets clamped so device metadata cannot name a row outside them.
#include <cstdint>

#include "../common/compat.h"
#include "kv_cache_params.h"

SELFATTN_KERNELS_BEGIN

struct SequenceRows {
  int count;  // rows of the sequence: [0, rows.seq]
  int first;  // its row 0 among the entry's rows
  int entry;  // the batch entry of the views holding them: b (dense) or 0 (packed)
};

__host__ __device__ inline int new_rows_clamp(int32_t value, int low, int high) {
  return value < low ? low : (value > high ? high : int(value));
}

__host__ __device__ inline SequenceRows sequence_rows(const NewRows& rows, int b) {
  if (rows.offsets == nullptr) return SequenceRows{rows.seq, 0, b};
  const int begin = new_rows_clamp(rows.offsets[b], 0, rows.total);
  const int end = new_rows_clamp(rows.offsets[b + 1], begin, rows.total);
  return SequenceRows{end - begin < rows.seq ? end - begin : rows.seq, begin, 0};
}

// Row i of a sequence among every row of the call, head by head: the index of its lse entry
// ([batch, heads, seq_q], packed [heads, total_q]) and of its split partials.
__host__ __device__ inline int64_t flat_row(const NewRows& rows, const SequenceRows& sequence, int heads, int head,
                                            int i) {
  return (int64_t(sequence.entry) * heads + head) * rows.total + sequence.first + i;
}

// Packed: whether row `row` of the entry belongs to a sequence of the call (sequence_rows of the
// last sequence starting at or before it). Rows past the last sequence, and rows past a
// sequence's first rows.seq, belong to none: nothing computes them, so nothing may write them.
// Dense: every row does. A binary search over the non-decreasing offsets.
__host__ __device__ inline bool packed_row_owned(const NewRows& rows, int batch, int row) {
  if (rows.offsets == nullptr) return true;
  int low = 0, high = batch;  // the first sequence starting after `row` lies in [low, high]
  while (low < high) {
    const int middle = (low + high) / 2;
    if (new_rows_clamp(rows.offsets[middle], 0, rows.total) <= row) {
      low = middle + 1;
    } else {
      high = middle;
    }
  }
  if (low == 0) return false;
  const SequenceRows sequence = sequence_rows(rows, low - 1);
  return row - sequence.first < sequence.count;
}

SELFATTN_KERNELS_END
