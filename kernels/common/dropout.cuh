#pragma once
// Dropout on the attention probabilities, in one place for every kernel and the CPU reference
// (AttentionOptions::dropout_p in attention.h states the rule): after the softmax, probability
// P[b, h, i, j] is kept with probability 1 - p and then scaled by 1 / (1 - p), else zeroed; the LSE
// and the softmax's sum are those of P before dropout. Whether an element is kept is a pure
// function of (seed, offset, b, h, i, j), so every path, tiling, split and the backward get the
// same bit for it without storing a mask:
//   key      (k0, k1) = (low, high 32 bits of seed)
//   counter  (j / 4, i, low, high 32 bits of offset + b * heads + h)   (a 64-bit sum)
//   word     philox4x32_10(counter, key).word[j % 4]
//   keep     word >= threshold, threshold = floor(p * 2^32)  (ScoreMods::dropout_threshold)
// b is the batch (varlen: the sequence), i the query row and j the key, both counted within the
// sequence from 0 (key_start does not move them). Four keys share one Philox call, as four words
// come out of it. The offset is PyTorch's philox offset: calls sharing a seed draw disjoint words
// when their offsets differ by at least batch * heads.
#include <cstdint>

#include "compat.h"
#include "philox.cuh"
#include "../params.h"

SELFATTN_KERNELS_BEGIN

// The threshold of rate p (0 <= p < 1): floor(p * 2^32), so that the kept words, those at or
// above it, are a share 1 - p of all 2^32 to within 2^-32. 0 (p below 2^-32) drops nothing.
__host__ __device__ inline uint32_t dropout_threshold(double p) {
  const double words = p * 4294967296.0;
  return words >= 4294967295.0 ? 4294967295u : uint32_t(words);
}

// The element's stream: b * heads + h.
__host__ __device__ inline uint32_t dropout_stream(int batch, int heads, int head) {
  return uint32_t(batch) * uint32_t(heads) + uint32_t(head);
}
// The same for batch `batch` of a kernel's view: the call's batch plus dropout_batch_base (the
// naive paths run a varlen call's sequences as calls of batch 1).
__host__ __device__ inline uint32_t dropout_stream(const ScoreMods& m, int batch, int head) {
  return dropout_stream(batch + m.dropout_batch_base, m.dropout_heads, head);
}

// Whether element (stream, row, key) survives dropout: the rule at the top.
__host__ __device__ inline bool dropout_keep(uint64_t seed, uint64_t offset, uint32_t threshold, uint64_t stream,
                                             int row, int key) {
  const uint64_t base = offset + stream;
  const Philox4x32 counter{{uint32_t(key) >> 2, uint32_t(row), uint32_t(base), uint32_t(base >> 32)}};
  const Philox4x32 words = philox4x32_10(counter, uint32_t(seed), uint32_t(seed >> 32));
  // Word key % 4 by selection: an index computed at run time would put the four words in local
  // memory (a stack frame in every fused kernel).
  const uint32_t word = (key & 2) != 0 ? ((key & 1) != 0 ? words.word[3] : words.word[2])
                                       : ((key & 1) != 0 ? words.word[1] : words.word[0]);
  return word >= threshold;
}

// A probability (or dP's element, in the backward) after dropout: value / (1 - p) when kept, else 0.
// Only called when m.dropout_threshold != 0 (dropout on): without it every kernel's arithmetic is
// what it was.
__device__ __forceinline__ float dropout_apply(const ScoreMods& m, uint32_t stream, int row, int key, float value) {
  return dropout_keep(m.dropout_seed, m.dropout_offset, m.dropout_threshold, stream, row, key) ? value * m.dropout_scale
                                                                                               : 0.0f;
}

SELFATTN_KERNELS_END
