#pragma once
// The FP8 forward's pre-pass: V^T for each (batch, kv head), into the workspace. 8-bit wgmma takes
// its B operand K-major only, so O += P V needs V with the keys contiguous: vt[b][h][d][key]
// ([batch, kv_heads, head_dim, keys_padded], bytes). Within each 16-key group (counted from the
// sequence's first key) the keys are stored in the order P's registers hold them
// (smem_layout.h, fp8_pv_key): column c of a group holds key fp8_pv_key(c). Keys from the batch's
// key length on (up to keys_padded) are written as zeros, never read: the forward's P V then adds
// 0 * 0 there, whatever V's padding rows hold (NaN included), so it needs no zeroing step of its own.
// Cost: one more read of V and one write of V^T, in FP8 (about 1-2% of the forward at 4k keys).
//
// One block of 256 threads transposes kKeys keys x head_dim through shared memory: it reads whole
// 16-byte chunks of V's rows (rows are 16-byte aligned: path_fused.cpp) and writes 4 keys (one
// 32-bit word) per store along vt's rows.
#include <cstdint>

#include "../common/causal_mask.cuh"
#include "../common/compat.h"
#include "../common/primitives.cuh"
#include "../launch.h"
#include "flash_fwd_hopper_params.h"
#include "smem_layout.h"

SELFATTN_KERNELS_BEGIN

struct TransposeVFp8Traits {
  static constexpr int kKeys = 64;      // keys per block: 4 whole 16-key groups; 64 x 256 bytes of smem at most
  static constexpr int kThreads = 256;
  static constexpr int kMaxHeadDim = 256;
  static constexpr int kPitch = kMaxHeadDim + 16;  // smem row: keeps 16-byte alignment, staggers banks
  static constexpr size_t kSmemBytes = size_t(kKeys) * kPitch;
};

__global__ void __launch_bounds__(TransposeVFp8Traits::kThreads) transpose_v_fp8_kernel(const TransposeVFp8Params p) {
  using Tr = TransposeVFp8Traits;
  const int batch = blockIdx.z, kv_head = blockIdx.y, key0 = blockIdx.x * Tr::kKeys;
  const int k_len = key_length(p.key_lengths, batch, p.seq_k);
  const int chunks = p.head_dim / 16;  // 16-byte chunks per V row
  unsigned char* tile = dynamic_smem<unsigned char>();
  const unsigned char* v =
      static_cast<const unsigned char*>(p.v) + batch * p.v_stride_batch + kv_head * p.v_stride_head;
  for (int i = int(threadIdx.x); i < Tr::kKeys * chunks; i += Tr::kThreads) {
    const int row = i / chunks, chunk = i % chunks, key = key0 + row;
    uint4 value{0, 0, 0, 0};
    if (key < k_len) value = load_vector(reinterpret_cast<const uint4*>(v + key * p.v_stride_row + 16 * chunk));
    store_vector(reinterpret_cast<uint4*>(tile + row * Tr::kPitch + 16 * chunk), value);
  }
  __syncthreads();
  unsigned char* vt = static_cast<unsigned char*>(p.vt) +
                      (int64_t(batch) * gridDim.y + kv_head) * int64_t(p.head_dim) * p.keys_padded;
  constexpr int kWords = Tr::kKeys / 4;  // 32-bit words per vt row segment
  for (int i = int(threadIdx.x); i < p.head_dim * kWords; i += Tr::kThreads) {
    const int d = i / kWords, column0 = 4 * (i % kWords);
    uint32_t word = 0;
    for (int j = 0; j < 4; ++j) {
      const int column = column0 + j;
      const int row = column / 16 * 16 + fp8_pv_key(column % 16);
      word |= uint32_t(tile[row * Tr::kPitch + d]) << (8 * j);
    }
    store_vector(reinterpret_cast<uint32_t*>(vt + int64_t(d) * p.keys_padded + key0 + column0), word);
  }
}

SELFATTN_KERNELS_END
