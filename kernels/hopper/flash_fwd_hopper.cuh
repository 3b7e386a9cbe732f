#pragma once
// The fused attention forward for Hopper (sm_90a) on f16 or bf16 q, k, v: flash_fwd_hopper_pipeline.cuh
// (the producer ring, barriers, ping-pong and S/PV overlap; read its comment first) with the 16-bit
// operands. f16 or bf16 in and out, fp32 accumulation; varlen, GQA, the masks and modifiers and the
// LSE as flash_fwd.cuh. What this file decides:
//   - S = Q K^T and O += P V on the 16-bit wgmma (m64nNk16): Q and K K-major as stored; V as
//     stored, read MN-major (the wgmma transposes B), so no pre-pass.
//   - P is packed from S's accumulator registers two probabilities per register: per warp the C
//     fragment of S is exactly the A fragment of P V (as with mma.sync).
//   - Rows of the last V tile past the sequence's keys but inside the tensor (another sequence's,
//     or padding past a key length) are zeroed by the producer warp once the tile lands.
//   - No descales.
#include <cstdint>

#include "../common/compat.h"
#include "../common/primitives.cuh"
#include "../common/primitives_hopper.cuh"
#include "../launch.h"
#include "flash_fwd_hopper_params.h"
#include "flash_fwd_hopper_pipeline.cuh"
#include "smem_layout.h"

SELFATTN_KERNELS_BEGIN

template <int HeadDimQk, int HeadDimV, int BlockKeys, int Stages>
struct FlashFwdHopperTraits
    : FlashFwdHopperPipelineTraits<HeadDimQk, HeadDimV, BlockKeys, Stages, /*ElementBytes=*/2> {
  static_assert(BlockKeys % 16 == 0 && BlockKeys <= 256, "keys per tile: whole P V k-steps, one TMA box");
};

// The configuration of each shipped head-dim pair (the only place tile sizes are chosen).
template <int HeadDimQk, int HeadDimV>
struct FlashFwdHopperConfig;
// D = 64, 128: 128-key tiles, two stages (80 KB / 160 KB). Per consumer thread S and O hold 64 + 32
// or 64 + 64 floats.
template <> struct FlashFwdHopperConfig<64, 64> { using Traits = FlashFwdHopperTraits<64, 64, 128, 2>; };
template <> struct FlashFwdHopperConfig<128, 128> { using Traits = FlashFwdHopperTraits<128, 128, 128, 2>; };
// MLA's prefill, (192, 128): S and O as at D = 128 (64 + 64 floats; the longer Q K^T costs k-steps,
// not registers); 128-key tiles, two stages: Q 48 KB + K 2 x 48 KB + V 2 x 32 KB = 208 KB.
template <> struct FlashFwdHopperConfig<192, 128> { using Traits = FlashFwdHopperTraits<192, 128, 128, 2>; };
// D = 256: O alone is 128 floats per thread; 64-key tiles (S 32 floats), two stages (192 KB).
template <> struct FlashFwdHopperConfig<256, 256> { using Traits = FlashFwdHopperTraits<256, 256, 64, 2>; };

// The pipeline's operand policy for f16 / bf16 (flash_fwd_hopper_pipeline.cuh lists the contract).
template <class T, class TraitsT>
struct FlashFwdHopper16BitOperands {
  using Traits = TraitsT;
  using Params = FlashFwdHopperParams;
  using Out = T;
  static constexpr int DQK = Traits::kHeadDimQk;  // S = Q K^T's k
  static constexpr int DV = Traits::kHeadDimV;    // O += P V's n
  static constexpr int BN = Traits::kBlockKeys;
  static constexpr int kPvSteps = BN / 16;  // k16 steps
  static constexpr bool kVarlen = true;
  static constexpr bool kZeroesVTail = true;

  // V as stored: head_dim_v / 64 boxes of (64 columns, BN keys), like K.
  static __device__ __forceinline__ void load_v(unsigned char* v_stage, const Params& hp, int key_row, int kv_head,
                                                int batch_coord, uint64_t* v_full) {
    for (int c = 0; c < Traits::kVColumnBlocks; ++c)
      tma_load_4d(v_stage + c * BN * 128, &hp.v_map, Traits::kBoxColumns * c, key_row, kv_head, batch_coord, v_full);
  }

  // Whether the last key tile (from last_key0) has V rows past the sequence's keys inside the
  // tensor, to be zeroed (rows past the tensor's end arrive as zeros from the TMA).
  static __device__ __forceinline__ bool last_v_needs_zeros(const Params& hp, const FlashSequence& seq, int key_tiles,
                                                            int last_key0) {
    return key_tiles > 0 && last_key0 + BN > seq.k_len && seq.k_row_start + seq.k_len < int64_t(hp.k_map_rows);
  }

  // The producer warp's stores of zeros over rows zero_from.. of the landed V tile. Whole 128-byte
  // rows: the swizzle only permutes 16-byte chunks inside a row.
  static __device__ __forceinline__ void zero_v_tail(unsigned char* v_stage, int zero_from, int lane) {
    const int rows = BN - zero_from;
    for (int i = lane; i < Traits::kVColumnBlocks * rows * 8; i += 32) {
      const int c = i / (rows * 8), row = zero_from + i / 8 % rows, chunk = i % 8;
      store_vector(reinterpret_cast<uint4*>(v_stage + c * BN * 128 + row * 128 + chunk * 16), uint4{0, 0, 0, 0});
    }
  }

  // S = Q K^T for the warpgroup's 64 rows: score[4t + i] is the C fragment of keys 8t..8t+7.
  static __device__ __forceinline__ void issue_scores(float (&score)[BN / 2], uint32_t q_address, int group_row0,
                                                      uint32_t k_address) {
    SELFATTN_FLASH_UNROLL
    for (int ks = 0; ks < DQK / 16; ++ks) {
      wgmma_ss<T, BN>(score, k_major_desc(q_address, Traits::kBlockRows, group_row0, 16 * ks),
                      k_major_desc(k_address, BN, 0, 16 * ks), ks > 0);
    }
    wgmma_commit();
  }

  // O += P V, V MN-major: k-step kk covers keys 16kk..16kk+15.
  static __device__ __forceinline__ void issue_pv(float (&acc)[DV / 2], const uint32_t (&p_frag)[kPvSteps][4],
                                                  uint32_t v_address) {
    SELFATTN_FLASH_UNROLL
    for (int kk = 0; kk < kPvSteps; ++kk)
      wgmma_rs<T, DV, /*TransposeB=*/1>(acc, p_frag[kk], mn_major_desc(v_address, BN, 16 * kk), true);
    wgmma_commit();
  }

  // The probabilities as P V's A operand: k-step kk is S's column tiles 2kk (A's columns 0-7) and
  // 2kk + 1 (8-15); each C pair (c0,c1) / (c2,c3) is A's register for row group / group + 8.
  static __device__ __forceinline__ void pack_probabilities(uint32_t (&p_frag)[kPvSteps][4],
                                                            const float (&score)[BN / 2]) {
    SELFATTN_FLASH_UNROLL
    for (int kk = 0; kk < kPvSteps; ++kk) {
      const float* lo = score + 4 * (2 * kk);
      const float* hi = score + 4 * (2 * kk + 1);
      p_frag[kk][0] = pack2<T>(lo[0], lo[1]);
      p_frag[kk][1] = pack2<T>(lo[2], lo[3]);
      p_frag[kk][2] = pack2<T>(hi[0], hi[1]);
      p_frag[kk][3] = pack2<T>(hi[2], hi[3]);
    }
  }

  // 16-bit inputs are the values themselves: nothing to descale.
  struct Descales {};
  static __device__ __forceinline__ Descales load_descales(const Params&, int, int) { return {}; }
  static __device__ __forceinline__ void descale_scores(const Descales&, float (&)[BN / 2]) {}
  static __device__ __forceinline__ void descale_out(const Params&, const Descales&, float (&)[DV / 2]) {}
};

template <class T, class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_fwd_hopper_kernel(const __grid_constant__ FlashFwdHopperParams hp) {
  flash_fwd_hopper_pipeline<FlashFwdHopper16BitOperands<T, Traits>>(hp);
}

// Declared in registry.inc (hopper/flash_fwd_hopper_kernels.inc lists them); instances/sm90a/flash_fwd_hopper_*.cu
// instantiate them.
template <Element E, int HeadDimQk, int HeadDimV>
FlashFwdHopperInstance flash_fwd_hopper_instance() {
  using Traits = typename FlashFwdHopperConfig<HeadDimQk, HeadDimV>::Traits;
  return flash_fwd_hopper_instance_of<Traits, FlashFwdHopperParams,
                                      flash_fwd_hopper_kernel<typename FlashElement<E>::Type, Traits>>(
      "flash_fwd_hopper_kernel");
}

SELFATTN_KERNELS_END
