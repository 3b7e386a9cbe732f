#pragma once
// The mask in one place for every kernel: which keys each query row sees.
#include <cstdint>

#include "compat.h"
#include "../params.h"

SELFATTN_KERNELS_BEGIN

// A batch's key length: key_lengths[batch] clamped to [0, seq_k], or seq_k without key lengths.
__host__ __device__ inline int key_length(const int32_t* key_lengths, int batch, int seq_k) {
  if (key_lengths == nullptr) return seq_k;
  const int given = key_lengths[batch];
  return given < 0 ? 0 : (given < seq_k ? given : seq_k);
}

// Where one sequence's keys start and end, and which key position its row 0 is aligned with
// (selfattn::Causal in types.h, AttentionOptions::key_start and q_offset in attention.h). Keys
// [begin, end) exist (keys before begin are padding: key_start); key positions count from begin,
// and row `row` is aligned with key index row0 + row:
//   q_offset given  row0 = begin + q_offset                (the caller's absolute position of row 0)
//   top_left        row0 = begin
//   bottom_right    row0 = begin + (end - begin) - q_len   (and under none: the last row at the last key)
struct SequenceKeys {
  int begin, end;
  int64_t row0;
};

// Device metadata, clamped: key_start into [0, end], q_offset into [0, 2^31 - 2^16] (the largest
// size attention.h allows), so a wrong entry gives wrong rows but no key outside [0, end) and no
// aligned position outside int (aligned_key).
constexpr int32_t kMaxQueryOffset = 2147418112;  // 2^31 - 2^16
__host__ __device__ inline SequenceKeys sequence_keys(int q_len, int end, CausalMask causal, const int32_t* key_start,
                                                      const int32_t* q_offset, int batch) {
  SequenceKeys keys{0, end, 0};
  if (key_start != nullptr) {
    const int32_t given = key_start[batch];
    keys.begin = given < 0 ? 0 : (given < end ? given : end);
  }
  if (q_offset != nullptr) {
    const int32_t given = q_offset[batch];
    keys.row0 = int64_t(keys.begin) + (given < 0 ? 0 : (given < kMaxQueryOffset ? given : kMaxQueryOffset));
  } else if (causal != CausalMask::top_left) {
    keys.row0 = int64_t(end) - q_len;
  } else {
    keys.row0 = keys.begin;
  }
  return keys;
}
// A sequence with keys [0, k_len) and no offsets.
__host__ __device__ inline SequenceKeys sequence_keys(int q_len, int k_len, CausalMask causal) {
  return sequence_keys(q_len, k_len, causal, nullptr, nullptr, 0);
}

// The key position row `row` is aligned with (the i' of the window and of ALiBi): row0 + row, at
// most INT_MAX (only a q_offset past every key gets there), so `aligned - key` cannot overflow.
__host__ __device__ inline int aligned_key(int row, const SequenceKeys& keys) {
  const int64_t aligned = keys.row0 + row;
  return aligned > INT32_MAX ? INT32_MAX : int(aligned);
}

// Keys [begin, end) that query `row` sees under the causal mask and the sliding window
// (window_left, window_right; -1 unbounded): with i' = aligned_key(row),
//   end   = min(keys.end, i' + 1 under a causal mask, i' + window_right + 1)
//   begin = max(keys.begin, i' - window_left)
// and begin >= end means none (normalised to begin == end, both in [keys.begin, keys.end]). Both
// bounds are non-decreasing in row, so the first and the last row of a tile bound the keys any row
// of it sees.
struct KeyRange {
  int begin, end;
  __host__ __device__ bool empty() const { return begin >= end; }
};
__host__ __device__ inline KeyRange visible_key_range(int row, const SequenceKeys& keys, CausalMask causal,
                                                      int window_left, int window_right) {
  // int64 sums: an aligned row near INT_MAX plus a wide window must not wrap.
  const int64_t i = keys.row0 + row;
  int64_t end = keys.end, begin = keys.begin;
  if (causal != CausalMask::none && i + 1 < end) end = i + 1;
  if (window_right >= 0 && i + window_right + 1 < end) end = i + window_right + 1;
  if (window_left >= 0 && i - window_left > begin) begin = i - window_left;
  if (end < keys.begin) end = keys.begin;
  if (begin > end) begin = end;
  return {int(begin), int(end)};
}
// The same for a sequence with keys [0, k_len) and no offsets.
__host__ __device__ inline KeyRange visible_key_range(int row, int q_len, int k_len, CausalMask causal, int window_left,
                                                      int window_right) {
  return visible_key_range(row, sequence_keys(q_len, k_len, causal), causal, window_left, window_right);
}

SELFATTN_KERNELS_END
