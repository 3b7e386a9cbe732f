#pragma once
// Fused attention backward, the query side, for deterministic mode: dQ of one query tile per block,
// no atomics (every element of dq is computed by one thread in one fixed order, so results are
// bitwise identical run to run). The dK/dV kernel (flash_bwd_dkdv.cuh) runs without its dQ part.
//
// Cost: this kernel recomputes S = Q K^T and dP = dO V^T, which the dK/dV kernel already formed,
// and adds dQ = dS K: 7 matrix products per (query tile, key tile) in all instead of the atomic
// mode's 5.
//
// One block owns kBlockRows query rows of one (batch, head), each warp 16 of them (one m-tile):
//   1. Q and dO tiles are copied to shared memory once, the rows' LSE and D kept in registers;
//   2. K/V tiles stream through two shared-memory stages (cp.async), only those the rows see
//      (flash_block_keys, as the forward);
//   3. per tile, each warp computes S and dP for its rows in registers, dS from them
//      (flash_bwd_common.cuh), rounds dS to the input dtype into A fragments (the C -> A register
//      reuse of flash_fwd.cuh), and accumulates dQ += dS K;
//   4. dQ * scale is stored once; a row that sees no key stores exact zeros.
// Two head dims as the dK/dV kernel: Q, K and dQ rows of head_dim_qk, dO and V rows of head_dim_v.
#include <cstdint>

#include "../common/compat.h"
#include "../common/primitives.cuh"
#include "../forward/flash_fwd.cuh"
#include "../forward/flash_fwd_sequence.cuh"
#include "flash_bwd_common.cuh"
#include "flash_bwd_params.h"

SELFATTN_KERNELS_BEGIN

template <int HeadDimQk, int HeadDimV, int Warps, int BlockKeys>
struct FlashBwdDqTraits {
  static_assert(HeadDimQk % 16 == 0 && HeadDimV % 16 == 0, "both head dims are whole numbers of mma k-steps");
  static_assert(BlockKeys % 16 == 0, "keys per tile are a whole number of dS K k-steps");
  static constexpr int kHeadDimQk = HeadDimQk;       // rows of Q, K, dQ
  static constexpr int kHeadDimV = HeadDimV;         // rows of dO, V
  static constexpr int kWarps = Warps;
  static constexpr int kThreads = Warps * 32;
  static constexpr int kBlockRows = Warps * 16;      // a warp owns one 16-row m-tile: its dQ never leaves its registers
  static constexpr int kBlockKeys = BlockKeys;
  static constexpr int kKeyTiles = BlockKeys / 8;    // n8 tiles of S and dP
  static constexpr int kDimTiles = HeadDimQk / 8;    // n8 tiles of dQ
  static constexpr int kQkRowElems = HeadDimQk + 8;  // Q and K rows, +16 bytes: conflict-free ldmatrix
  static constexpr int kVRowElems = HeadDimV + 8;    // dO and V rows, padded alike
  static constexpr int kStages = 2;                  // double buffering: load tile j+1 during tile j

  static constexpr size_t kQElems = size_t(kBlockRows) * kQkRowElems;
  static constexpr size_t kDoElems = size_t(kBlockRows) * kVRowElems;
  static constexpr size_t kKTileElems = size_t(kBlockKeys) * kQkRowElems;
  static constexpr size_t kVTileElems = size_t(kBlockKeys) * kVRowElems;
  // Q and dO once; K and V stages.
  static constexpr size_t kSmemBytes = (kQElems + kDoElems + kStages * (kKTileElems + kVTileElems)) * 2;
};

// The configuration of each shipped head-dim pair. A thread holds dQ of its 16 rows (HeadDimQk / 2
// floats) and S + dP of one key tile (kBlockKeys / 2 floats each): 64-key tiles keep that at most
// 128 floats up to D = 128; register counts: scripts/resource_report.sh.
template <int HeadDimQk, int HeadDimV>
struct FlashBwdDqConfig;
template <> struct FlashBwdDqConfig<32, 32> { using Traits = FlashBwdDqTraits<32, 32, 4, 64>; };
template <> struct FlashBwdDqConfig<64, 64> { using Traits = FlashBwdDqTraits<64, 64, 4, 64>; };
template <> struct FlashBwdDqConfig<96, 96> { using Traits = FlashBwdDqTraits<96, 96, 4, 64>; };
// D = 128: 32-key tiles. With 64 the staged Q, dO and two K/V stages take 102 KB of shared memory,
// past the 99 KB a block may have on the 8.6 and 8.9 GPUs (RTX 30/40, A10, L40S) that run the
// default build's sm_80 code; 32 take 68 KB (the sim's launch check holds sm_80 code to 99 KB).
template <> struct FlashBwdDqConfig<128, 128> { using Traits = FlashBwdDqTraits<128, 128, 4, 32>; };
// MLA's prefill, (192, 128): dQ takes 96 registers; 32-key tiles keep shared memory at 84 KB (Q 64 x
// 200, dO 64 x 136, two stages of K 32 x 200 and V 32 x 136).
template <> struct FlashBwdDqConfig<192, 128> { using Traits = FlashBwdDqTraits<192, 128, 4, 32>; };

template <class T, class Traits>
__global__ void __launch_bounds__(Traits::kThreads) flash_bwd_dq_kernel(const FlashBwdParams p) {
  constexpr int NT = Traits::kKeyTiles;
  constexpr int DT = Traits::kDimTiles;
  constexpr int QK_RE = Traits::kQkRowElems, V_RE = Traits::kVRowElems;
  const FlashFwdParams& f = p.fwd;

  const int batch = blockIdx.z, head = blockIdx.y;
  const FlashSequence seq = flash_sequence(f, batch);
  // Query tiles in reverse, as the forward: under a causal mask the last tiles see the most keys.
  const int block_row0 = int(gridDim.x - 1 - blockIdx.x) * Traits::kBlockRows;
  if (block_row0 >= seq.q_len) return;  // varlen: this sequence is shorter than the longest

  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int group = lane / 4, in_group = lane % 4;  // mma fragment coordinates (primitives_fragments.cuh)
  const int kv_head = head / f.heads_per_kv_head;
  const T* q = static_cast<const T*>(f.q) + batch * f.q_stride_batch + head * f.q_stride_head +
               seq.q_row_start * f.q_stride_row;
  const T* d_o = static_cast<const T*>(p.dout) + batch * p.dout_stride_batch + head * p.dout_stride_head +
                 seq.q_row_start * p.dout_stride_row;
  const T* k = static_cast<const T*>(f.k) + batch * f.k_stride_batch + kv_head * f.k_stride_head +
               seq.k_row_start * f.k_stride_row;
  const T* v = static_cast<const T*>(f.v) + batch * f.v_stride_batch + kv_head * f.v_stride_head +
               seq.k_row_start * f.v_stride_row;

  const int block_q_rows = seq.q_len - block_row0 < Traits::kBlockRows ? seq.q_len - block_row0 : Traits::kBlockRows;
  const FlashBlockKeys block_keys = flash_block_keys(f, seq, block_row0, block_q_rows, Traits::kBlockKeys);
  const int key_tiles = block_keys.end_tile - block_keys.first_tile;
  const int first_key = block_keys.first_tile * Traits::kBlockKeys;
  const HeadScoreMods mods = head_score_mods(f.mods, batch, head);

  T* q_tile = dynamic_smem<T>();
  T* do_tile = q_tile + Traits::kQElems;
  T* k_stages = do_tile + Traits::kDoElems;
  T* v_stages = k_stages + Traits::kStages * Traits::kKTileElems;

  if (key_tiles > 0) {
    flash_load_qk_rows<Traits>(q_tile, q + block_row0 * f.q_stride_row, f.q_stride_row, Traits::kBlockRows, 0,
                               block_q_rows);
    flash_load_v_rows<Traits>(do_tile, d_o + block_row0 * p.dout_stride_row, p.dout_stride_row, Traits::kBlockRows, 0,
                              block_q_rows);
    flash_load_qk_rows<Traits>(k_stages, k + first_key * f.k_stride_row, f.k_stride_row, Traits::kBlockKeys,
                               seq.keys.begin - first_key, seq.k_len - first_key);
    flash_load_v_rows<Traits>(v_stages, v + first_key * f.v_stride_row, f.v_stride_row, Traits::kBlockKeys,
                              seq.keys.begin - first_key, seq.k_len - first_key);
    cp_async_commit();
  }

  // This thread's two rows: group and group + 8 of the warp's m-tile; their LSE (log2 units; -inf
  // past the sequence: P = 0) and D.
  const int warp_row0 = warp * 16;
  float lse_log2[2], d_row[2];
  SELFATTN_FLASH_UNROLL
  for (int half = 0; half < 2; ++half) {
    const int row = block_row0 + warp_row0 + group + 8 * half;
    const bool valid = row < seq.q_len;
    const int64_t entry = flash_bwd_row_entry(f, seq, batch, head, valid ? row : 0);
    lse_log2[half] = valid ? f.lse[entry] * kLog2e : -INFINITY;
    d_row[half] = valid ? p.d[entry] : 0.0f;
  }
  float acc[DT][4];
  SELFATTN_FLASH_UNROLL
  for (int dt = 0; dt < DT; ++dt)
    SELFATTN_FLASH_UNROLL
    for (int i = 0; i < 4; ++i) acc[dt][i] = 0.0f;

  for (int tile = 0; tile < key_tiles; ++tile) {
    const int key0 = first_key + tile * Traits::kBlockKeys;
    const T* k_tile = k_stages + (tile % 2) * Traits::kKTileElems;
    const T* v_tile = v_stages + (tile % 2) * Traits::kVTileElems;
    if (tile + 1 < key_tiles) {
      const int next0 = key0 + Traits::kBlockKeys;
      flash_load_qk_rows<Traits>(k_stages + ((tile + 1) % 2) * Traits::kKTileElems, k + next0 * f.k_stride_row,
                                 f.k_stride_row, Traits::kBlockKeys, seq.keys.begin - next0, seq.k_len - next0);
      flash_load_v_rows<Traits>(v_stages + ((tile + 1) % 2) * Traits::kVTileElems, v + next0 * f.v_stride_row,
                                f.v_stride_row, Traits::kBlockKeys, seq.keys.begin - next0, seq.k_len - next0);
      cp_async_commit();
      cp_async_wait<1>();  // this tile (and Q, dO) landed; the next one stays in flight
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // other threads' copies are visible

    // ---- S = Q K^T and dP = dO V^T for this warp's rows: s[nt] is the C fragment of keys nt*8..+7.
    float s[NT][4], dp[NT][4];
    SELFATTN_FLASH_UNROLL
    for (int nt = 0; nt < NT; ++nt)
      SELFATTN_FLASH_UNROLL
      for (int i = 0; i < 4; ++i) s[nt][i] = dp[nt][i] = 0.0f;
    // S over head_dim_qk, dP over head_dim_v. A = the warp's 16 Q (dO) rows (matrices rows 0-7 / 8-15
    // x cols 0-7 / 8-15 = a0..a3); B = two key tiles x two k halves: {b0, b1} of key tile 2np, then
    // of 2np + 1.
    SELFATTN_FLASH_UNROLL
    for (int ks = 0; ks < Traits::kHeadDimQk / 16; ++ks) {
      uint32_t q_frag[4];
      ldmatrix<4>(q_frag, q_tile + (warp_row0 + lane % 16) * QK_RE + ks * 16 + (lane / 16) * 8);
      SELFATTN_FLASH_UNROLL
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t k_frag[4];
        ldmatrix<4>(k_frag, k_tile + (np * 16 + (lane / 16) * 8 + lane % 8) * QK_RE + ks * 16 + ((lane / 8) % 2) * 8);
        const uint32_t k_even[2] = {k_frag[0], k_frag[1]}, k_odd[2] = {k_frag[2], k_frag[3]};
        mma_m16n8k16<T>(s[2 * np], q_frag, k_even, s[2 * np]);
        mma_m16n8k16<T>(s[2 * np + 1], q_frag, k_odd, s[2 * np + 1]);
      }
    }
    SELFATTN_FLASH_UNROLL
    for (int ks = 0; ks < Traits::kHeadDimV / 16; ++ks) {
      uint32_t do_frag[4];
      ldmatrix<4>(do_frag, do_tile + (warp_row0 + lane % 16) * V_RE + ks * 16 + (lane / 16) * 8);
      SELFATTN_FLASH_UNROLL
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t v_frag[4];
        ldmatrix<4>(v_frag, v_tile + (np * 16 + (lane / 16) * 8 + lane % 8) * V_RE + ks * 16 + ((lane / 8) % 2) * 8);
        const uint32_t v_even[2] = {v_frag[0], v_frag[1]}, v_odd[2] = {v_frag[2], v_frag[3]};
        mma_m16n8k16<T>(dp[2 * np], do_frag, v_even, dp[2 * np]);
        mma_m16n8k16<T>(dp[2 * np + 1], do_frag, v_odd, dp[2 * np + 1]);
      }
    }

    // ---- dS, element by element, into dp.
    const bool needs_mask = !flash_tile_unmasked(block_keys, key0, Traits::kBlockKeys);
    SELFATTN_FLASH_UNROLL
    for (int half = 0; half < 2; ++half) {
      const int row = block_row0 + warp_row0 + group + 8 * half;
      const KeyRange seen = needs_mask ? flash_visible_keys(f, seq, row) : KeyRange{0, 0};
      const int aligned = aligned_key(row, seq.keys);
      SELFATTN_FLASH_UNROLL
      for (int nt = 0; nt < NT; ++nt) {
        SELFATTN_FLASH_UNROLL
        for (int j = 0; j < 2; ++j) {
          const int key = key0 + nt * 8 + 2 * in_group + j;
          const bool visible = !needs_mask || (key >= seen.begin && key < seen.end);
          dp[nt][2 * half + j] = flash_bwd_score(f, mods, s[nt][2 * half + j], dp[nt][2 * half + j], visible, row,
                                                 aligned, key, lse_log2[half], d_row[half])
                                     .ds;
        }
      }
    }

    // ---- dQ += dS K. k-step ks covers keys ks*16..+15: C tiles 2ks and 2ks + 1 become A's
    // registers (rounded to the input dtype); B = K stored [key][dim], .trans gives keys x dims.
    SELFATTN_FLASH_UNROLL
    for (int ks = 0; ks < Traits::kBlockKeys / 16; ++ks) {
      uint32_t ds_frag[4];
      ds_frag[0] = pack2<T>(dp[2 * ks][0], dp[2 * ks][1]);
      ds_frag[1] = pack2<T>(dp[2 * ks][2], dp[2 * ks][3]);
      ds_frag[2] = pack2<T>(dp[2 * ks + 1][0], dp[2 * ks + 1][1]);
      ds_frag[3] = pack2<T>(dp[2 * ks + 1][2], dp[2 * ks + 1][3]);
      SELFATTN_FLASH_UNROLL
      for (int dq = 0; dq < DT / 2; ++dq) {
        uint32_t b[4];
        ldmatrix_trans<4>(b, k_tile + (ks * 16 + ((lane / 8) % 2) * 8 + lane % 8) * QK_RE + dq * 16 + (lane / 16) * 8);
        const uint32_t k_even[2] = {b[0], b[1]}, k_odd[2] = {b[2], b[3]};
        mma_m16n8k16<T>(acc[2 * dq], ds_frag, k_even, acc[2 * dq]);
        mma_m16n8k16<T>(acc[2 * dq + 1], ds_frag, k_odd, acc[2 * dq + 1]);
      }
    }
    __syncthreads();  // every warp is done with this stage before the next iteration refills it
  }

  // ---- dQ * scale.
  SELFATTN_FLASH_UNROLL
  for (int half = 0; half < 2; ++half) {
    const int row = block_row0 + warp_row0 + group + 8 * half;
    if (row >= seq.q_len) continue;
    const int64_t dq_row = batch * p.dq_stride_batch + head * p.dq_stride_head + (seq.q_row_start + row) * p.dq_stride_row;
    SELFATTN_FLASH_UNROLL
    for (int dt = 0; dt < DT; ++dt)
      flash_bwd_store_pair(p.dq, p.dq_element, dq_row + dt * 8 + 2 * in_group, acc[dt][2 * half] * f.scale,
                           acc[dt][2 * half + 1] * f.scale);
  }
}

template <class T, int HeadDimQk, int HeadDimV>
FlashBwdInstance flash_bwd_dq_instance_for() {
  using Traits = typename FlashBwdDqConfig<HeadDimQk, HeadDimV>::Traits;
  FlashBwdInstance instance;
  instance.kernel = make_kernel_ref<FlashBwdParams, flash_bwd_dq_kernel<T, Traits>>("flash_bwd_dq_kernel");
  instance.block_threads = Traits::kThreads;
  instance.block_tile = Traits::kBlockRows;
  instance.loop_tile = Traits::kBlockKeys;
  instance.smem_bytes = Traits::kSmemBytes;
  return instance;
}

// Declared in backward/registry_fused.inc; instances/flash_bwd_*.cu instantiate the shipped pairs.
template <Element E, int HeadDimQk, int HeadDimV>
FlashBwdInstance flash_bwd_dq_instance() {
  return flash_bwd_dq_instance_for<typename FlashElement<E>::Type, HeadDimQk, HeadDimV>();
}

SELFATTN_KERNELS_END
