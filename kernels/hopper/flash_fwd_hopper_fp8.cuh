#pragma once
// The FP8 (e4m3) fused forward for Hopper (sm_90a): flash_fwd_hopper_pipeline.cuh (the producer
// ring, barriers, ping-pong and S/PV overlap; read its comment first) with e4m3 operands on the
// 8-bit wgmma (m64nNk32, e4m3 x e4m3 -> f32), f16 or bf16 out. What this file decides, and why:
//   - 8-bit wgmma reads both operands K-major (no transpose). Q and K are K-major as stored; for
//     O += P V the B operand must be V^T (keys contiguous), which the pre-pass
//     (transpose_v_fp8.cuh) writes into the workspace: vt_map's boxes are (128 keys, head_dim rows).
//   - P is the A operand straight from S's accumulator registers, four probabilities per register
//     (pack4_e4m3): the keys of each 16-key group then sit in A's columns in a fixed permuted order,
//     and V^T stores its keys in the same order (smem_layout.h, fp8_pv_key: the invariant).
//   - The pre-pass writes zeros for keys from the batch's key length on, so there is no zeroing of
//     the last V tile here (kZeroesVTail false); K rows past the keys are masked to -inf by
//     selection as in every Hopper kernel.
//   - Scales: the real scores are (q . k as stored) * q_descale * k_descale; the kernel multiplies
//     the tile's S registers by qk_descale once they land (64 FMULs per thread per tile, beside the
//     softmax's 64 exp2; skipped when it is 1), so the softmax, its modifiers and the LSE see the
//     true scores. P = exp2(score - max) in [0, 1] is rounded to e4m3 (RN, satfinite) for P V, the
//     row sum l taken from the fp32 P (FlashAttention-3's choice). O is multiplied by v_descale
//     once, before flash_store_row divides by l and stores f16/bf16.
// Supports what flash_fwd_hopper.cuh does except varlen and key_start (path_fused.cpp,
// fused_takes_fp8), and no dropout.
#include <cstdint>

#include "../common/compat.h"
#include "../common/primitives.cuh"
#include "../common/primitives_hopper.cuh"
#include "../launch.h"
#include "flash_fwd_hopper_params.h"
#include "flash_fwd_hopper_pipeline.cuh"
#include "smem_layout.h"

SELFATTN_KERNELS_BEGIN

template <int HeadDim, int BlockKeys, int Stages>
struct FlashFwdHopperFp8Traits
    : FlashFwdHopperPipelineTraits<HeadDim, HeadDim, BlockKeys, Stages, /*ElementBytes=*/1> {
  static constexpr int kHeadDim = HeadDim;  // one head dim: q, k, v and V^T alike
  static_assert(BlockKeys == 64 || BlockKeys % 128 == 0, "keys per tile: whole V^T swizzle rows (64 or 128 bytes)");
  // V^T's rows are the tile's keys: 128 bytes (128-byte swizzle) from 128 keys on, else 64 (64-byte).
  static constexpr int kVtRowBytes = BlockKeys < 128 ? BlockKeys : 128;
  static constexpr int kKeyBlocks = BlockKeys / kVtRowBytes;  // TMA boxes per V^T tile
};

// The configuration of each shipped head dim (the only place tile sizes are chosen).
template <int HeadDim>
struct FlashFwdHopperFp8Config;
// D = 128: 128-key tiles (S 64 floats per consumer thread, as the 16-bit kernel), two stages: FP8
// tiles are half the bytes (80 KB in all); more stages would fit but the 16-bit kernel's two keep
// its tensor cores fed at twice the bytes per tile.
template <> struct FlashFwdHopperFp8Config<128> { using Traits = FlashFwdHopperFp8Traits<128, 128, 2>; };
// D = 256: O alone is 128 floats per thread; 128-key tiles spilled 800 bytes (ptxas), so 64-key tiles
// (S 32 floats, P 8 registers) as the 16-bit kernel, V^T in 64-byte swizzled rows; two stages (96 KB).
template <> struct FlashFwdHopperFp8Config<256> { using Traits = FlashFwdHopperFp8Traits<256, 64, 2>; };

// The pipeline's operand policy for e4m3 (flash_fwd_hopper_pipeline.cuh lists the contract).
template <class TOut, class TraitsT>
struct FlashFwdHopperFp8Operands {
  using Traits = TraitsT;
  using Params = FlashFwdHopperFp8Params;
  using Out = TOut;
  static constexpr int D = Traits::kHeadDim;
  static constexpr int BN = Traits::kBlockKeys;
  static constexpr int kPvSteps = BN / 32;  // k32 steps
  static constexpr bool kVarlen = false;       // path_fused.cpp routes varlen calls elsewhere
  static constexpr bool kZeroesVTail = false;  // the pre-pass wrote zeros past the key length

  // V^T: BN / kVtRowBytes boxes of (kVtRowBytes keys, head_dim rows). key_row is the key itself
  // (no varlen), V^T's key coordinate.
  static __device__ __forceinline__ void load_v(unsigned char* v_stage, const Params& hp, int key_row, int kv_head,
                                                int batch_coord, uint64_t* v_full) {
    for (int c = 0; c < Traits::kKeyBlocks; ++c)
      tma_load_4d(v_stage + c * D * Traits::kVtRowBytes, &hp.vt_map, key_row + Traits::kVtRowBytes * c, 0, kv_head,
                  batch_coord, v_full);
  }

  // S = Q K^T for the warpgroup's 64 rows, k32 steps along the head dim.
  static __device__ __forceinline__ void issue_scores(float (&score)[BN / 2], uint32_t q_address, int group_row0,
                                                      uint32_t k_address) {
    SELFATTN_FLASH_UNROLL
    for (int ks = 0; ks < D / 32; ++ks) {
      wgmma_ss_e4m3<BN>(score, k_major_desc_8bit(q_address, Traits::kBlockRows, group_row0, 32 * ks),
                        k_major_desc_8bit(k_address, BN, 0, 32 * ks), ks > 0);
    }
    wgmma_commit();
  }

  // O += P V^T's transpose: k32 step kk covers the tile's keys 32kk..32kk+31 (in fp8_pv_key's order).
  static __device__ __forceinline__ void issue_pv(float (&acc)[D / 2], const uint32_t (&p_frag)[kPvSteps][4],
                                                  uint32_t vt_address) {
    SELFATTN_FLASH_UNROLL
    for (int kk = 0; kk < kPvSteps; ++kk)
      wgmma_rs_e4m3<D>(acc, p_frag[kk], k_major_desc_8bit(vt_address, D, 0, 32 * kk, Traits::kVtRowBytes), true);
    wgmma_commit();
  }

  // The probabilities as P V's A operand: register r of k32 step m, byte b, is S register
  // fp8_p_score_index(m, r, b) rounded to e4m3 (smem_layout.h states the permutation this makes).
  static __device__ __forceinline__ void pack_probabilities(uint32_t (&p_frag)[kPvSteps][4],
                                                            const float (&score)[BN / 2]) {
    SELFATTN_FLASH_UNROLL
    for (int m = 0; m < kPvSteps; ++m) {
      SELFATTN_FLASH_UNROLL
      for (int r = 0; r < 4; ++r) {
        p_frag[m][r] = pack4_e4m3(score[fp8_p_score_index(m, r, 0)], score[fp8_p_score_index(m, r, 1)],
                                  score[fp8_p_score_index(m, r, 2)], score[fp8_p_score_index(m, r, 3)]);
      }
    }
  }

  // The descales are fp32 [batch, kv_heads], null for 1: this (batch, kv head)'s entry, and the
  // factor the stored scores take, q_descale * k_descale.
  struct Descales {
    int index;  // batch * kv_heads + kv_head
    float qk;   // q_descale * k_descale
  };
  static __device__ __forceinline__ Descales load_descales(const Params& hp, int batch, int kv_head) {
    const int descale_index = batch * hp.kv_heads + kv_head;
    return {descale_index, (hp.q_descale != nullptr ? hp.q_descale[descale_index] : 1.0f) *
                               (hp.k_descale != nullptr ? hp.k_descale[descale_index] : 1.0f)};
  }
  // The tile's S as stored to the true scores, before the softmax sees them.
  static __device__ __forceinline__ void descale_scores(const Descales& descales, float (&score)[BN / 2]) {
    const float qk_descale = descales.qk;
    if (qk_descale != 1.0f) {
      SELFATTN_FLASH_UNROLL
      for (int i = 0; i < BN / 2; ++i) score[i] *= qk_descale;
    }
  }
  // O * v_descale, once, after the last P V (v_descale read only then).
  static __device__ __forceinline__ void descale_out(const Params& hp, const Descales& descales, float (&acc)[D / 2]) {
    const float v_descale = hp.v_descale != nullptr ? hp.v_descale[descales.index] : 1.0f;
    if (v_descale != 1.0f) {
      SELFATTN_FLASH_UNROLL
      for (int i = 0; i < D / 2; ++i) acc[i] *= v_descale;
    }
  }
};

template <class TOut, class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_fwd_hopper_fp8_kernel(const __grid_constant__ FlashFwdHopperFp8Params hp) {
  flash_fwd_hopper_pipeline<FlashFwdHopperFp8Operands<TOut, Traits>>(hp);
}

// Declared in registry.inc; instances/sm90a/flash_fwd_hopper_e4m3.cu instantiates the shipped pairs
// (E: out's element, f16 or bf16; q, k, v are e4m3).
template <Element E, int HeadDim>
FlashFwdHopperInstance flash_fwd_hopper_fp8_instance() {
  using Traits = typename FlashFwdHopperFp8Config<HeadDim>::Traits;
  return flash_fwd_hopper_instance_of<Traits, FlashFwdHopperFp8Params,
                                      flash_fwd_hopper_fp8_kernel<typename FlashElement<E>::Type, Traits>>(
      "flash_fwd_hopper_fp8_kernel");
}

SELFATTN_KERNELS_END
