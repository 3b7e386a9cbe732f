#pragma once
// Fused attention backward, the key side: dK and dV of one key tile per block, and (non-deterministic
// mode) its share of dQ by fp32 atomics. FlashAttention-2's backward on the fused forward's
// instructions (mma.sync m16n8k16, ldmatrix, cp.async), f16 or bf16 in, fp32 accumulation.
//
// One block owns kBlockKeys keys of one (batch, kv head); each warp owns 16 of them:
//   1. the K and V tiles are copied to shared memory once;
//   2. for each query head of the kv head's GQA group and each query tile whose rows see a key of
//      the tile (flash_bwd_rows_seeing; the other tiles are never loaded), Q and dO stream through
//      two shared-memory stages (cp.async: item i+1 is in flight while item i is computed), with
//      the rows' LSE and D beside them;
//   3. per item, each warp computes S^T = K Q^T and dP^T = V dO^T for its 16 keys in registers,
//      P^T and dS^T from them (flash_bwd_common.cuh: mask, modifiers, softcap derivative), rounds
//      both to the input dtype and turns them, without leaving registers, into the A operands of
//      dV += P^T dO and dK += dS^T Q (the C fragment of m16n8k16 holds, per thread, exactly the
//      elements the A fragment wants, as in flash_fwd.cuh);
//   4. dQ += dS K needs dS with queries as rows, across all warps' keys: each warp writes its dS^T
//      rows to shared memory, and after a barrier each warp computes one slice of the tile's dQ
//      (ldmatrix .trans turns the stored dS^T into dS) and adds it into the fp32 accumulator with
//      atomics;
//   5. dK * scale and dV are stored once, straight from registers. Key rows past the key length
//      (inside the view) are written as 0.
// Deterministic mode (dq_accum null) skips step 4; flash_bwd_dq.cuh computes dQ per query tile:
// 4 matrix products here and 3 there, 7 instead of 5, but no atomics and bitwise-stable results.
//
// Two head dims (MLA's prefill: 192 and 128): K, Q, dK and dQ rows have head_dim_qk elements (S^T
// runs head_dim_qk / 16 k-steps, dK head_dim_qk / 8 n8 tiles), V, dO and dV rows head_dim_v.
//
// Shared-memory rows are padded by 16 bytes, as in flash_fwd.cuh: conflict-free ldmatrix.
#include <cstdint>

#include "../common/compat.h"
#include "../common/primitives.cuh"
#include "../forward/flash_fwd.cuh"
#include "../forward/flash_fwd_sequence.cuh"
#include "flash_bwd_common.cuh"
#include "flash_bwd_params.h"

SELFATTN_KERNELS_BEGIN

template <int HeadDimQk, int HeadDimV, int Warps, int BlockRows>
struct FlashBwdKvTraits {
  static_assert(HeadDimQk % 16 == 0 && HeadDimV % 16 == 0, "both head dims are whole numbers of mma k-steps");
  static_assert(BlockRows % 16 == 0, "query rows per tile are a whole number of k-steps of dV += P^T dO");
  static constexpr int kHeadDimQk = HeadDimQk;       // rows of K, Q, dK, dQ
  static constexpr int kHeadDimV = HeadDimV;         // rows of V, dO, dV
  // The loops over both head dims' k-steps or tiles run this far, each product guarded by its own
  // bound (with equal head dims: the one-head-dim kernel's loops, unchanged).
  static constexpr int kMaxHeadDim = HeadDimQk > HeadDimV ? HeadDimQk : HeadDimV;
  static constexpr int kWarps = Warps;
  static constexpr int kThreads = Warps * 32;
  static constexpr int kBlockKeys = Warps * 16;      // a warp owns one 16-key m-tile: its dK, dV never leave its registers
  static constexpr int kBlockRows = BlockRows;       // query rows per staged Q/dO tile (n of S^T)
  static constexpr int kRowTiles = BlockRows / 8;    // n8 tiles of S^T and dP^T
  static constexpr int kQkDimTiles = HeadDimQk / 8;  // n8 tiles of dK (and dQ)
  static constexpr int kVDimTiles = HeadDimV / 8;    // n8 tiles of dV
  static constexpr int kQkRowElems = HeadDimQk + 8;  // K and Q rows, +16 bytes: conflict-free ldmatrix
  static constexpr int kVRowElems = HeadDimV + 8;    // V and dO rows, padded alike
  static constexpr int kDsRowElems = BlockRows + 8;  // dS^T rows, padded the same way
  static constexpr int kStages = 2;                  // double buffering: load item i+1 during item i
  // dQ of a tile (kBlockRows x HeadDimQk) by dS K: its 16-row m-tiles split over the warps, and when
  // there are fewer m-tiles than warps, each m-tile's dim tiles split over kDqWarpsPerMTile warps.
  static constexpr int kDqMTiles = BlockRows / 16;
  static constexpr int kDqWarpsPerMTile = Warps / kDqMTiles;
  static constexpr int kDqDimTiles = kQkDimTiles / kDqWarpsPerMTile;
  static_assert(kDqMTiles <= Warps && Warps % kDqMTiles == 0, "every warp takes a part of one dQ m-tile");
  static_assert(kQkDimTiles % kDqWarpsPerMTile == 0 && kDqDimTiles % 2 == 0, "dim tiles go in ldmatrix.x4 pairs");

  static constexpr size_t kKTileElems = size_t(kBlockKeys) * kQkRowElems;
  static constexpr size_t kVTileElems = size_t(kBlockKeys) * kVRowElems;
  static constexpr size_t kQTileElems = size_t(kBlockRows) * kQkRowElems;
  static constexpr size_t kDoTileElems = size_t(kBlockRows) * kVRowElems;
  static constexpr size_t kDsElems = size_t(kBlockKeys) * kDsRowElems;
  // K, V; Q and dO stages; dS^T; then fp32 LSE (times log2 e) and D stages.
  static constexpr size_t kSmemBytes =
      (kKTileElems + kVTileElems + kStages * (kQTileElems + kDoTileElems) + kDsElems) * 2 +
      2 * kStages * size_t(kBlockRows) * 4;
};

// The configuration of each shipped head-dim pair (the only place its tile sizes are chosen). A
// thread holds dK and dV of its warp's 16 keys (HeadDimQk / 2 and HeadDimV / 2 floats) for the whole
// block, plus S^T and dP^T of one query tile (kBlockRows / 2 floats each); register counts:
// scripts/resource_report.sh.
template <int HeadDimQk, int HeadDimV>
struct FlashBwdKvConfig;
// D = 32, 64: dK + dV take 32 / 64 registers, so 64-row query tiles fit (S^T + dP^T: 64).
template <> struct FlashBwdKvConfig<32, 32> { using Traits = FlashBwdKvTraits<32, 32, 4, 64>; };
template <> struct FlashBwdKvConfig<64, 64> { using Traits = FlashBwdKvTraits<64, 64, 4, 64>; };
// D = 96, 128: dK + dV take 96 / 128 registers: 32-row query tiles (S^T + dP^T: 32).
template <> struct FlashBwdKvConfig<96, 96> { using Traits = FlashBwdKvTraits<96, 96, 4, 32>; };
template <> struct FlashBwdKvConfig<128, 128> { using Traits = FlashBwdKvTraits<128, 128, 4, 32>; };
// MLA's prefill, (192, 128): dK + dV take 96 + 64 = 160 registers: 16-row query tiles (S^T + dP^T: 16).
template <> struct FlashBwdKvConfig<192, 128> { using Traits = FlashBwdKvTraits<192, 128, 4, 16>; };
// D = 256 is not shipped: dK + dV alone would take 256 registers per thread.

template <class T, class Traits>
__global__ void __launch_bounds__(Traits::kThreads) flash_bwd_dkdv_kernel(const FlashBwdParams p) {
  constexpr int NT = Traits::kRowTiles;
  constexpr int QK_DT = Traits::kQkDimTiles, V_DT = Traits::kVDimTiles;
  constexpr int QK_RE = Traits::kQkRowElems, V_RE = Traits::kVRowElems;
  constexpr int DSE = Traits::kDsRowElems;
  constexpr int BR = Traits::kBlockRows;
  constexpr int BK = Traits::kBlockKeys;
  const FlashFwdParams& f = p.fwd;

  const int batch = blockIdx.z, kv_head = blockIdx.y;
  const FlashSequence seq = flash_sequence(f, batch);
  const int key0 = int(blockIdx.x) * BK;
  // Key rows this block writes: every row of the view in a padded batch (past the key length they
  // get 0), the sequence's own under varlen (the rest belong to other sequences or stay the
  // caller's zeros).
  const int store_keys = f.cu_seqlens_q != nullptr ? seq.k_len : f.seq_k;
  if (key0 >= store_keys) return;

  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int group = lane / 4, in_group = lane % 4;  // mma fragment coordinates (primitives_fragments.cuh)
  const int group_size = f.heads_per_kv_head;
  const T* k = static_cast<const T*>(f.k) + batch * f.k_stride_batch + kv_head * f.k_stride_head +
               seq.k_row_start * f.k_stride_row;
  const T* v = static_cast<const T*>(f.v) + batch * f.v_stride_batch + kv_head * f.v_stride_head +
               seq.k_row_start * f.v_stride_row;

  // Items: (query head of the group, query tile) pairs whose rows may see a key of this tile.
  const int tile_keys = seq.k_len - key0 < BK ? seq.k_len - key0 : BK;  // <= 0: past the key length
  const KeyRange rows = flash_bwd_rows_seeing(f, seq, key0, key0 + tile_keys);
  const int first_tile = rows.begin / BR;
  const int query_tiles = rows.end > rows.begin ? (rows.end + BR - 1) / BR - first_tile : 0;
  const int items = query_tiles * group_size;

  T* k_tile = dynamic_smem<T>();
  T* v_tile = k_tile + Traits::kKTileElems;
  T* q_stages = v_tile + Traits::kVTileElems;
  T* do_stages = q_stages + Traits::kStages * Traits::kQTileElems;
  T* ds_tile = do_stages + Traits::kStages * Traits::kDoTileElems;
  float* lse_stages = reinterpret_cast<float*>(ds_tile + Traits::kDsElems);
  float* d_stages = lse_stages + Traits::kStages * BR;

  // Stages item `item`: Q and dO by cp.async (the caller commits), LSE and D by plain stores
  // (visible after the barrier that opens the item; rows past the sequence get LSE -inf: P = 0).
  const auto load_item = [&](int item, int stage) {
    const int head = kv_head * group_size + item / query_tiles;
    const int row0 = (first_tile + item % query_tiles) * BR;
    const T* q = static_cast<const T*>(f.q) + batch * f.q_stride_batch + head * f.q_stride_head +
                 (seq.q_row_start + row0) * f.q_stride_row;
    const T* d_o = static_cast<const T*>(p.dout) + batch * p.dout_stride_batch + head * p.dout_stride_head +
                   (seq.q_row_start + row0) * p.dout_stride_row;
    flash_load_qk_rows<Traits>(q_stages + stage * Traits::kQTileElems, q, f.q_stride_row, BR, 0, seq.q_len - row0);
    flash_load_v_rows<Traits>(do_stages + stage * Traits::kDoTileElems, d_o, p.dout_stride_row, BR, 0,
                              seq.q_len - row0);
    for (int r = int(threadIdx.x); r < BR; r += Traits::kThreads) {
      const int row = row0 + r;
      const bool valid = row < seq.q_len;
      const int64_t entry = flash_bwd_row_entry(f, seq, batch, head, valid ? row : 0);
      lse_stages[stage * BR + r] = valid ? f.lse[entry] * kLog2e : -INFINITY;
      d_stages[stage * BR + r] = valid ? p.d[entry] : 0.0f;
    }
  };

  if (items > 0) {
    flash_load_qk_rows<Traits>(k_tile, k + key0 * f.k_stride_row, f.k_stride_row, BK, seq.keys.begin - key0,
                               seq.k_len - key0);
    flash_load_v_rows<Traits>(v_tile, v + key0 * f.v_stride_row, f.v_stride_row, BK, seq.keys.begin - key0,
                              seq.k_len - key0);
    load_item(0, 0);
    cp_async_commit();
  }

  // This thread's keys: warp_key0 + group and + 8 (rows of the C fragments of dK and dV).
  const int warp_key0 = warp * 16;
  float dk_acc[QK_DT][4], dv_acc[V_DT][4];
  SELFATTN_FLASH_UNROLL
  for (int dt = 0; dt < Traits::kMaxHeadDim / 8; ++dt)
    SELFATTN_FLASH_UNROLL
    for (int i = 0; i < 4; ++i) {
      if (dt < QK_DT) dk_acc[dt][i] = 0.0f;
      if (dt < V_DT) dv_acc[dt][i] = 0.0f;
    }

  for (int item = 0; item < items; ++item) {
    const int stage = item % 2;
    if (item + 1 < items) {
      load_item(item + 1, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();  // this item (and K, V) landed; the next one stays in flight
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // other threads' copies and LSE/D stores are visible
    const int head = kv_head * group_size + item / query_tiles;
    const int row0 = (first_tile + item % query_tiles) * BR;
    const T* q_tile = q_stages + stage * Traits::kQTileElems;
    const T* do_tile = do_stages + stage * Traits::kDoTileElems;
    const float* lse_tile = lse_stages + stage * BR;
    const float* d_tile = d_stages + stage * BR;
    const HeadScoreMods mods = head_score_mods(f.mods, batch, head);

    // ---- S^T = K Q^T and dP^T = V dO^T for this warp's keys: st[nt] is the C fragment of query
    // rows row0 + nt*8 .. +7 (columns), keys warp_key0 + group / + 8 (rows).
    float st[NT][4], dpt[NT][4];
    SELFATTN_FLASH_UNROLL
    for (int nt = 0; nt < NT; ++nt)
      SELFATTN_FLASH_UNROLL
      for (int i = 0; i < 4; ++i) st[nt][i] = dpt[nt][i] = 0.0f;
    // S^T over head_dim_qk's k-steps, dP^T over head_dim_v's (one loop: with equal head dims each
    // k-step's K and V fragments are in flight together). A = the warp's 16 K (V) rows (matrices rows
    // 0-7 / 8-15 x cols 0-7 / 8-15 = a0..a3); B = Q^T (dO^T) of two 8-row tiles x two k halves: {b0,
    // b1} of tile 2np, then 2np + 1.
    SELFATTN_FLASH_UNROLL
    for (int ks = 0; ks < Traits::kMaxHeadDim / 16; ++ks) {
      uint32_t k_frag[4], v_frag[4];
      if (ks < Traits::kHeadDimQk / 16)
        ldmatrix<4>(k_frag, k_tile + (warp_key0 + lane % 16) * QK_RE + ks * 16 + (lane / 16) * 8);
      if (ks < Traits::kHeadDimV / 16)
        ldmatrix<4>(v_frag, v_tile + (warp_key0 + lane % 16) * V_RE + ks * 16 + (lane / 16) * 8);
      SELFATTN_FLASH_UNROLL
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t q_frag[4], do_frag[4];
        if (ks < Traits::kHeadDimQk / 16)
          ldmatrix<4>(q_frag, q_tile + (np * 16 + (lane / 16) * 8 + lane % 8) * QK_RE + ks * 16 + ((lane / 8) % 2) * 8);
        if (ks < Traits::kHeadDimV / 16)
          ldmatrix<4>(do_frag,
                      do_tile + (np * 16 + (lane / 16) * 8 + lane % 8) * V_RE + ks * 16 + ((lane / 8) % 2) * 8);
        const uint32_t q_even[2] = {q_frag[0], q_frag[1]}, q_odd[2] = {q_frag[2], q_frag[3]};
        const uint32_t do_even[2] = {do_frag[0], do_frag[1]}, do_odd[2] = {do_frag[2], do_frag[3]};
        if (ks < Traits::kHeadDimQk / 16) {
          mma_m16n8k16<T>(st[2 * np], k_frag, q_even, st[2 * np]);
          mma_m16n8k16<T>(st[2 * np + 1], k_frag, q_odd, st[2 * np + 1]);
        }
        if (ks < Traits::kHeadDimV / 16) {
          mma_m16n8k16<T>(dpt[2 * np], v_frag, do_even, dpt[2 * np]);
          mma_m16n8k16<T>(dpt[2 * np + 1], v_frag, do_odd, dpt[2 * np + 1]);
        }
      }
    }

    // ---- P^T and dS^T, element by element; st becomes P^T, dpt becomes dS^T.
    const int tile_rows = seq.q_len - row0 < BR ? seq.q_len - row0 : BR;
    const bool needs_mask = !flash_tile_unmasked(flash_block_keys(f, seq, row0, tile_rows, BK), key0, BK);
    SELFATTN_FLASH_UNROLL
    for (int nt = 0; nt < NT; ++nt) {
      SELFATTN_FLASH_UNROLL
      for (int j = 0; j < 2; ++j) {
        const int col = nt * 8 + 2 * in_group + j;
        const int row = row0 + col;
        // Recomputed per item rather than held in registers across the loop (a few integer ops).
        const KeyRange seen = needs_mask ? flash_visible_keys(f, seq, row) : KeyRange{0, 0};
        const int aligned = aligned_key(row, seq.keys);
        SELFATTN_FLASH_UNROLL
        for (int half = 0; half < 2; ++half) {
          const int key = key0 + warp_key0 + group + 8 * half;
          const bool visible = !needs_mask || (key >= seen.begin && key < seen.end);
          const FlashBwdScore score = flash_bwd_score(f, mods, st[nt][2 * half + j], dpt[nt][2 * half + j], visible,
                                                      row, aligned, key, lse_tile[col], d_tile[col]);
          st[nt][2 * half + j] = score.p;
          dpt[nt][2 * half + j] = score.ds;
        }
      }
    }
    // A operands over the query rows (k of dV += P^T dO): k-step ks covers rows ks*16..+15, i.e. C
    // tiles 2ks (A's columns 0-7) and 2ks + 1 (8-15), rounded to the input dtype.
    uint32_t p_frag[NT / 2][4], ds_frag[NT / 2][4];
    SELFATTN_FLASH_UNROLL
    for (int ks = 0; ks < NT / 2; ++ks) {
      p_frag[ks][0] = pack2<T>(st[2 * ks][0], st[2 * ks][1]);
      p_frag[ks][1] = pack2<T>(st[2 * ks][2], st[2 * ks][3]);
      p_frag[ks][2] = pack2<T>(st[2 * ks + 1][0], st[2 * ks + 1][1]);
      p_frag[ks][3] = pack2<T>(st[2 * ks + 1][2], st[2 * ks + 1][3]);
      ds_frag[ks][0] = pack2<T>(dpt[2 * ks][0], dpt[2 * ks][1]);
      ds_frag[ks][1] = pack2<T>(dpt[2 * ks][2], dpt[2 * ks][3]);
      ds_frag[ks][2] = pack2<T>(dpt[2 * ks + 1][0], dpt[2 * ks + 1][1]);
      ds_frag[ks][3] = pack2<T>(dpt[2 * ks + 1][2], dpt[2 * ks + 1][3]);
    }

    // ---- dV += P^T dO over head_dim_v's dim tiles, dK += dS^T Q over head_dim_qk's (one loop, as
    // above). B = dO (Q) stored [row][dim]; .trans gives K x N = rows x dims: {b0, b1} of dim tile
    // 2dp, then 2dp + 1.
    SELFATTN_FLASH_UNROLL
    for (int ks = 0; ks < NT / 2; ++ks) {
      SELFATTN_FLASH_UNROLL
      for (int dp = 0; dp < Traits::kMaxHeadDim / 16; ++dp) {
        uint32_t b[4];
        if (dp < V_DT / 2) {
          ldmatrix_trans<4>(b,
                            do_tile + (ks * 16 + ((lane / 8) % 2) * 8 + lane % 8) * V_RE + dp * 16 + (lane / 16) * 8);
          const uint32_t do_even[2] = {b[0], b[1]}, do_odd[2] = {b[2], b[3]};
          mma_m16n8k16<T>(dv_acc[2 * dp], p_frag[ks], do_even, dv_acc[2 * dp]);
          mma_m16n8k16<T>(dv_acc[2 * dp + 1], p_frag[ks], do_odd, dv_acc[2 * dp + 1]);
        }
        if (dp < QK_DT / 2) {
          ldmatrix_trans<4>(b,
                            q_tile + (ks * 16 + ((lane / 8) % 2) * 8 + lane % 8) * QK_RE + dp * 16 + (lane / 16) * 8);
          const uint32_t q_even[2] = {b[0], b[1]}, q_odd[2] = {b[2], b[3]};
          mma_m16n8k16<T>(dk_acc[2 * dp], ds_frag[ks], q_even, dk_acc[2 * dp]);
          mma_m16n8k16<T>(dk_acc[2 * dp + 1], ds_frag[ks], q_odd, dk_acc[2 * dp + 1]);
        }
      }
    }

    // ---- dQ += dS K (non-deterministic mode), through shared memory.
    if (p.dq_accum != nullptr) {
      // dS^T rows of this warp's keys: each register of ds_frag is a pair of adjacent query columns
      // of one key row (a0/a1: rows group / group + 8, columns ks*16 + 2 in_group; a2/a3: + 8).
      SELFATTN_FLASH_UNROLL
      for (int ks = 0; ks < NT / 2; ++ks) {
        T* top = ds_tile + (warp_key0 + group) * DSE + ks * 16 + 2 * in_group;
        T* bottom = top + 8 * DSE;
        *reinterpret_cast<uint32_t*>(top) = ds_frag[ks][0];
        *reinterpret_cast<uint32_t*>(bottom) = ds_frag[ks][1];
        *reinterpret_cast<uint32_t*>(top + 8) = ds_frag[ks][2];
        *reinterpret_cast<uint32_t*>(bottom + 8) = ds_frag[ks][3];
      }
      __syncthreads();  // every warp's dS^T rows are visible

      // This warp's slice: query m-tile mq, dims dim0 .. dim0 + kDqDimTiles*8.
      constexpr int QDT = Traits::kDqDimTiles;
      const int mq = warp % Traits::kDqMTiles;
      const int dim0 = (warp / Traits::kDqMTiles) * QDT * 8;
      float dq_acc[QDT][4];
      SELFATTN_FLASH_UNROLL
      for (int dt = 0; dt < QDT; ++dt)
        SELFATTN_FLASH_UNROLL
        for (int i = 0; i < 4; ++i) dq_acc[dt][i] = 0.0f;
      SELFATTN_FLASH_UNROLL
      for (int ks = 0; ks < BK / 16; ++ks) {
        // A = dS (queries x keys) from dS^T stored [key][query]: .trans; matrix m covers queries
        // (m % 2) * 8 and keys (m / 2) * 8 of the k-step, i.e. a0..a3 in order.
        uint32_t a[4];
        ldmatrix_trans<4>(a, ds_tile + (ks * 16 + (lane / 16) * 8 + lane % 8) * DSE + mq * 16 + ((lane / 8) % 2) * 8);
        SELFATTN_FLASH_UNROLL
        for (int dp = 0; dp < QDT / 2; ++dp) {
          // B = K stored [key][dim]; .trans gives K x N = keys x dims.
          uint32_t b[4];
          ldmatrix_trans<4>(b, k_tile + (ks * 16 + ((lane / 8) % 2) * 8 + lane % 8) * QK_RE + dim0 + dp * 16 +
                                   (lane / 16) * 8);
          const uint32_t k_even[2] = {b[0], b[1]}, k_odd[2] = {b[2], b[3]};
          mma_m16n8k16<T>(dq_acc[2 * dp], a, k_even, dq_acc[2 * dp]);
          mma_m16n8k16<T>(dq_acc[2 * dp + 1], a, k_odd, dq_acc[2 * dp + 1]);
        }
      }
      SELFATTN_FLASH_UNROLL
      for (int half = 0; half < 2; ++half) {
        const int row = row0 + mq * 16 + group + 8 * half;
        if (row >= seq.q_len) continue;
        float* dst = p.dq_accum + flash_bwd_row_entry(f, seq, batch, head, row) * Traits::kHeadDimQk + dim0;
        SELFATTN_FLASH_UNROLL
        for (int dt = 0; dt < QDT; ++dt) {
          atomicAdd(dst + dt * 8 + 2 * in_group, dq_acc[dt][2 * half]);
          atomicAdd(dst + dt * 8 + 2 * in_group + 1, dq_acc[dt][2 * half + 1]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage (and dS^T) before the next item refills it
  }

  // ---- dK * scale and dV. A key no row sees has accumulated exact zeros.
  SELFATTN_FLASH_UNROLL
  for (int half = 0; half < 2; ++half) {
    const int key = key0 + warp_key0 + group + 8 * half;
    if (key >= store_keys) continue;
    const int64_t dk_row = batch * p.dk_stride_batch + kv_head * p.dk_stride_head + (seq.k_row_start + key) * p.dk_stride_row;
    const int64_t dv_row = batch * p.dv_stride_batch + kv_head * p.dv_stride_head + (seq.k_row_start + key) * p.dv_stride_row;
    SELFATTN_FLASH_UNROLL
    for (int dt = 0; dt < Traits::kMaxHeadDim / 8; ++dt) {
      const int col = dt * 8 + 2 * in_group;
      if (dt < QK_DT)
        flash_bwd_store_pair(p.dk, p.dk_element, dk_row + col, dk_acc[dt][2 * half] * f.scale,
                             dk_acc[dt][2 * half + 1] * f.scale);
      if (dt < V_DT)
        flash_bwd_store_pair(p.dv, p.dv_element, dv_row + col, dv_acc[dt][2 * half], dv_acc[dt][2 * half + 1]);
    }
  }
}

template <class T, int HeadDimQk, int HeadDimV>
FlashBwdInstance flash_bwd_dkdv_instance_for() {
  using Traits = typename FlashBwdKvConfig<HeadDimQk, HeadDimV>::Traits;
  FlashBwdInstance instance;
  instance.kernel = make_kernel_ref<FlashBwdParams, flash_bwd_dkdv_kernel<T, Traits>>("flash_bwd_dkdv_kernel");
  instance.block_threads = Traits::kThreads;
  instance.block_tile = Traits::kBlockKeys;
  instance.loop_tile = Traits::kBlockRows;
  instance.smem_bytes = Traits::kSmemBytes;
  return instance;
}

// Declared in backward/registry_fused.inc; instances/flash_bwd_*.cu instantiate the shipped pairs.
template <Element E, int HeadDimQk, int HeadDimV>
FlashBwdInstance flash_bwd_dkdv_instance() {
  return flash_bwd_dkdv_instance_for<typename FlashElement<E>::Type, HeadDimQk, HeadDimV>();
}

SELFATTN_KERNELS_END
