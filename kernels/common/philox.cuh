#pragma once
// Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3", SC11),
// the counter-based generator cuRAND and PyTorch's CUDA dropout use: ten rounds of a keyed bijection
// of a 128-bit counter, so the random words of any counter are computed on the spot, by any thread,
// in any order, with no state. The library's one random generator (dropout.cuh is its one user);
// tests/primitives/test_philox.cpp checks it against the published known-answer vectors.
// __host__ __device__: the CPU reference (host/src/reference) draws the same words.
#include <cstdint>

#include "compat.h"

SELFATTN_KERNELS_BEGIN

struct Philox4x32 {
  uint32_t word[4];
};

// The high and low halves of a 32 x 32 -> 64-bit product (what __umulhi gives on the GPU; one
// 64-bit multiply does both on either compiler).
__host__ __device__ inline void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t product = uint64_t(a) * uint64_t(b);
  hi = uint32_t(product >> 32);
  lo = uint32_t(product);
}

// The four output words of counter `c` under key `k`. Each round multiplies words 0 and 2 by the
// round constants and mixes the halves with words 1, 3 and the key; the key is bumped by the Weyl
// constants between rounds (Random123's philox4x32_R with R = 10).
__host__ __device__ inline Philox4x32 philox4x32_10(Philox4x32 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kMul0, c.word[0], hi0, lo0);
    philox_mulhilo(kMul1, c.word[2], hi1, lo1);
    c = Philox4x32{{hi1 ^ c.word[1] ^ k0, lo1, hi0 ^ c.word[3] ^ k1, lo0}};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return c;
}

SELFATTN_KERNELS_END
