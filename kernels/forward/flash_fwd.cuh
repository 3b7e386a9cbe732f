#pragma once
// Fused attention forward on tensor cores (FlashAttention-2's algorithm on Ampere-class
// instructions: mma.sync m16n8k16, ldmatrix, cp.async), f16 or bf16 in, fp32 accumulation.
//
// One block computes one query tile of one (batch, head):
//   1. the Q tile is copied to shared memory once;
//   2. K/V tiles stream through two shared-memory stages (cp.async: tile j+1 is in flight while
//      tile j is computed); tiles outside the keys the block's rows can see (causal mask, key
//      length, sliding window) are never loaded, so a window's cost does not grow with seq_k;
//   3. per tile, each warp computes S = Q K^T for its own rows in registers, applies the score
//      modifiers (score_mods.cuh), folds it into the online softmax (running row max m and row
//      sum l, O rescaled by exp2(m_old - m_new)), turns the probabilities into the A operand of
//      the P V mma without leaving registers (the C fragment of m16n8k16 holds, per thread,
//      exactly the elements the A fragment wants), and accumulates O += P V;
//   4. O / l and the LSE are written once.
// Scores are kept in log2 units (scale * log2(e) folded into one multiply) so every exponential
// is a single exp2.
//
// Shared-memory rows are padded by 16 bytes: a row of D 16-bit elements then starts 4 banks after
// the previous one, so the 8 row addresses of each ldmatrix phase hit 8 disjoint groups of 4 banks.
//
// Two head dims: Q and K rows have head_dim_qk elements (S = Q K^T runs head_dim_qk / 16 k-steps),
// V and O rows head_dim_v (O is head_dim_v / 8 n8 tiles): MLA's prefill runs at (192, 128).
#include <cstdint>

#include "../common/compat.h"
#include "../common/primitives.cuh"
#include "flash_fwd_params.h"
#include "flash_fwd_sequence.cuh"
#include "flash_fwd_softmax.cuh"
#include "../launch.h"

SELFATTN_KERNELS_BEGIN

template <int HeadDimQk, int HeadDimV, int Warps, int MTilesPerWarp, int BlockKeys>
struct FlashFwdTraits {
  static_assert(HeadDimQk % 16 == 0, "q's and k's head dim is a whole number of mma k-steps");
  static_assert(HeadDimV % 16 == 0, "v's head dim is a whole number of ldmatrix.x4 pairs of n8 tiles");
  static_assert(BlockKeys % 16 == 0, "keys per tile are a whole number of P V k-steps");
  static constexpr int kHeadDimQk = HeadDimQk;
  static constexpr int kHeadDimV = HeadDimV;
  static constexpr int kWarps = Warps;
  static constexpr int kThreads = Warps * 32;
  static constexpr int kMTiles = MTilesPerWarp;         // 16-row mma tiles per warp: each K/V fragment feeds this many mmas
  static constexpr int kWarpRows = 16 * MTilesPerWarp;
  static constexpr int kBlockRows = Warps * kWarpRows;  // warps split the query rows, never the keys: no cross-warp softmax
  static constexpr int kBlockKeys = BlockKeys;
  static constexpr int kDimTiles = HeadDimV / 8;        // n8 tiles of O
  static constexpr int kKeyTiles = BlockKeys / 8;       // n8 tiles of S
  static constexpr int kQkRowElems = HeadDimQk + 8;     // Q and K rows, +16 bytes: conflict-free ldmatrix (see top)
  static constexpr int kVRowElems = HeadDimV + 8;       // V rows, padded alike
  static constexpr int kStages = 2;                     // double buffering: load tile j+1 during tile j

  static constexpr size_t kQElems = size_t(kBlockRows) * kQkRowElems;
  static constexpr size_t kKTileElems = size_t(kBlockKeys) * kQkRowElems;
  static constexpr size_t kVTileElems = size_t(kBlockKeys) * kVRowElems;
  static constexpr size_t kSmemBytes = (kQElems + kStages * (kKTileElems + kVTileElems)) * 2;
};

// The configuration of each shipped head dim (the only place tile sizes are chosen). Register
// counts are ptxas's for sm_90 (scripts/resource_report.sh); every one is spill-free.
// Shared memory bandwidth, not the tensor cores, bounds a warp of 16 rows (every K/V fragment it
// loads feeds one mma), so where registers allow, a warp takes 2 m-tiles (32 rows) and each K/V
// fragment feeds two mmas.
template <int HeadDimQk, int HeadDimV>
struct FlashFwdConfig;
// D = 32: little work per key; 16-row warps (102 registers) let 4+ blocks share an SM.
template <> struct FlashFwdConfig<32, 32> { using Traits = FlashFwdTraits<32, 32, 4, 1, 64>; };
// D = 64: 32-row warps and 64-key tiles just fit 255 registers (O 64 + S 64 floats).
template <> struct FlashFwdConfig<64, 64> { using Traits = FlashFwdTraits<64, 64, 4, 2, 64>; };
// D = 96, 128: 32-row warps; O takes 96 / 128 registers, so S gets 32-key tiles.
template <> struct FlashFwdConfig<96, 96> { using Traits = FlashFwdTraits<96, 96, 4, 2, 32>; };
template <> struct FlashFwdConfig<128, 128> { using Traits = FlashFwdTraits<128, 128, 4, 2, 32>; };
// MLA's prefill, (192, 128): O takes 128 registers as at D = 128 (the longer Q K^T costs k-steps,
// not registers: Q fragments are loaded per k-step), so the same tiling; 94 KB of shared memory
// (Q 128 x 200, two stages of K 32 x 200 and V 32 x 136) fits Ampere's and Ada's opt-in limits.
template <> struct FlashFwdConfig<192, 128> { using Traits = FlashFwdTraits<192, 128, 4, 2, 32>; };
// D = 256: O alone takes 128 registers per thread: 16-row warps, 32-key tiles.
template <> struct FlashFwdConfig<256, 256> { using Traits = FlashFwdTraits<256, 256, 4, 1, 32>; };

// Copies `rows` rows of Dim elements (row stride `stride` in global memory) into a tile of
// RowElems-element rows, Threads threads sharing the 16-byte chunks. Rows outside [valid_begin,
// valid_end) are zero-filled without reading global memory: past the sequence, or before its
// key_start (padding that may hold anything: P V must see 0 there, not NaN).
template <int Dim, int RowElems, int Threads, class T>
__device__ __forceinline__ void flash_load_rows(T* tile, const T* src, int64_t stride, int rows, int valid_begin,
                                                int valid_end) {
  constexpr int kChunks = Dim / 8;  // 16-byte cp.async chunks
  for (int i = threadIdx.x; i < rows * kChunks; i += Threads) {
    const int row = i / kChunks, chunk = i % kChunks;
    const bool valid = row >= valid_begin && row < valid_end;
    const T* from = valid ? src + row * stride + chunk * 8 : src;  // src: any mapped address
    cp_async_cg(tile + row * RowElems + chunk * 8, from, valid ? 16u : 0u);
  }
}
// The Q and K tiles (rows of head_dim_qk) and V tiles (head_dim_v) of the forward, and the backward's
// (whose dO tiles have V's rows).
template <class Traits, class T>
__device__ __forceinline__ void flash_load_qk_rows(T* tile, const T* src, int64_t stride, int rows, int valid_begin,
                                                   int valid_end) {
  flash_load_rows<Traits::kHeadDimQk, Traits::kQkRowElems, Traits::kThreads>(tile, src, stride, rows, valid_begin,
                                                                             valid_end);
}
template <class Traits, class T>
__device__ __forceinline__ void flash_load_v_rows(T* tile, const T* src, int64_t stride, int rows, int valid_begin,
                                                  int valid_end) {
  flash_load_rows<Traits::kHeadDimV, Traits::kVRowElems, Traits::kThreads>(tile, src, stride, rows, valid_begin,
                                                                           valid_end);
}
template <class T, class Traits>
__global__ void __launch_bounds__(Traits::kThreads) flash_fwd_kernel(const FlashFwdParams p) {
  constexpr int MT = Traits::kMTiles;
  constexpr int NT = Traits::kKeyTiles;
  constexpr int DT = Traits::kDimTiles;
  constexpr int QK_RE = Traits::kQkRowElems, V_RE = Traits::kVRowElems;

  const int batch = blockIdx.z, head = blockIdx.y;
  const FlashSequence seq = flash_sequence(p, batch);
  // Query tiles in reverse: under a causal mask the last tiles see the most keys, and starting
  // them first leaves the short ones for the tail of the grid.
  const int block_row0 = int(gridDim.x - 1 - blockIdx.x) * Traits::kBlockRows;
  if (block_row0 >= seq.q_len) return;  // varlen: this sequence is shorter than the longest

  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int group = lane / 4, in_group = lane % 4;  // mma fragment coordinates (primitives_fragments.cuh)
  const int kv_head = head / p.heads_per_kv_head;
  const T* q = static_cast<const T*>(p.q) + batch * p.q_stride_batch + head * p.q_stride_head +
               seq.q_row_start * p.q_stride_row;
  const T* k = static_cast<const T*>(p.k) + batch * p.k_stride_batch + kv_head * p.k_stride_head +
               seq.k_row_start * p.k_stride_row;
  const T* v = static_cast<const T*>(p.v) + batch * p.v_stride_batch + kv_head * p.v_stride_head +
               seq.k_row_start * p.v_stride_row;

  const int block_q_rows = seq.q_len - block_row0 < Traits::kBlockRows ? seq.q_len - block_row0 : Traits::kBlockRows;
  const FlashBlockKeys block_keys = flash_block_keys(p, seq, block_row0, block_q_rows, Traits::kBlockKeys);
  const int key_tiles = block_keys.end_tile - block_keys.first_tile;
  const int first_key = block_keys.first_tile * Traits::kBlockKeys;
  const HeadScoreMods mods = head_score_mods(p.mods, batch, head);

  T* q_tile = dynamic_smem<T>();
  T* k_stages = q_tile + Traits::kQElems;
  T* v_stages = k_stages + Traits::kStages * Traits::kKTileElems;

  if (key_tiles > 0) {
    flash_load_qk_rows<Traits>(q_tile, q + block_row0 * p.q_stride_row, p.q_stride_row, Traits::kBlockRows, 0,
                               block_q_rows);
    flash_load_qk_rows<Traits>(k_stages, k + first_key * p.k_stride_row, p.k_stride_row, Traits::kBlockKeys,
                               seq.keys.begin - first_key, seq.k_len - first_key);
    flash_load_v_rows<Traits>(v_stages, v + first_key * p.v_stride_row, p.v_stride_row, Traits::kBlockKeys,
                              seq.keys.begin - first_key, seq.k_len - first_key);
    cp_async_commit();
  }

  // This thread's two rows of each m-tile: group and group + 8.
  const int warp_row0 = warp * Traits::kWarpRows;
  FlashRowState row_state[MT][2];
  float acc[MT][DT][4];
  SELFATTN_FLASH_UNROLL
  for (int mt = 0; mt < MT; ++mt) {
    row_state[mt][0] = row_state[mt][1] = flash_row_start();
    SELFATTN_FLASH_UNROLL
    for (int dt = 0; dt < DT; ++dt)
      SELFATTN_FLASH_UNROLL
      for (int i = 0; i < 4; ++i) acc[mt][dt][i] = 0.0f;
  }

  for (int tile = 0; tile < key_tiles; ++tile) {
    const int key0 = first_key + tile * Traits::kBlockKeys;
    const T* k_tile = k_stages + (tile % 2) * Traits::kKTileElems;
    const T* v_tile = v_stages + (tile % 2) * Traits::kVTileElems;
    if (tile + 1 < key_tiles) {
      const int next0 = key0 + Traits::kBlockKeys;
      flash_load_qk_rows<Traits>(k_stages + ((tile + 1) % 2) * Traits::kKTileElems, k + next0 * p.k_stride_row,
                                 p.k_stride_row, Traits::kBlockKeys, seq.keys.begin - next0, seq.k_len - next0);
      flash_load_v_rows<Traits>(v_stages + ((tile + 1) % 2) * Traits::kVTileElems, v + next0 * p.v_stride_row,
                                p.v_stride_row, Traits::kBlockKeys, seq.keys.begin - next0, seq.k_len - next0);
      cp_async_commit();
      cp_async_wait<1>();  // this tile (and Q) landed; the next one stays in flight
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // other threads' copies are visible

    // ---- S = Q K^T for this warp's rows: score[mt][nt] is the C fragment of keys nt*8..nt*8+7.
    float score[MT][NT][4];
    SELFATTN_FLASH_UNROLL
    for (int mt = 0; mt < MT; ++mt)
      SELFATTN_FLASH_UNROLL
      for (int nt = 0; nt < NT; ++nt)
        SELFATTN_FLASH_UNROLL
        for (int i = 0; i < 4; ++i) score[mt][nt][i] = 0.0f;
    SELFATTN_FLASH_UNROLL
    for (int ks = 0; ks < Traits::kHeadDimQk / 16; ++ks) {
      uint32_t q_frag[MT][4];
      SELFATTN_FLASH_UNROLL
      for (int mt = 0; mt < MT; ++mt)  // matrices: rows 0-7 / 8-15 x cols 0-7 / 8-15 = a0..a3
        ldmatrix<4>(q_frag[mt], q_tile + (warp_row0 + mt * 16 + lane % 16) * QK_RE + ks * 16 + (lane / 16) * 8);
      SELFATTN_FLASH_UNROLL
      for (int np = 0; np < NT / 2; ++np) {
        // Two key tiles x two k halves: {b0, b1} of key tile 2np, then of 2np + 1.
        uint32_t k_frag[4];
        ldmatrix<4>(k_frag, k_tile + (np * 16 + (lane / 16) * 8 + lane % 8) * QK_RE + ks * 16 + ((lane / 8) % 2) * 8);
        const uint32_t b_even[2] = {k_frag[0], k_frag[1]}, b_odd[2] = {k_frag[2], k_frag[3]};
        SELFATTN_FLASH_UNROLL
        for (int mt = 0; mt < MT; ++mt) {
          mma_m16n8k16<T>(score[mt][2 * np], q_frag[mt], b_even, score[mt][2 * np]);
          mma_m16n8k16<T>(score[mt][2 * np + 1], q_frag[mt], b_odd, score[mt][2 * np + 1]);
        }
      }
    }

    // ---- online softmax (flash_fwd_softmax.cuh); score becomes the probabilities P (unnormalised, fp32).
    const bool needs_mask = !flash_tile_unmasked(block_keys, key0, Traits::kBlockKeys);
    SELFATTN_FLASH_UNROLL
    for (int mt = 0; mt < MT; ++mt) {
      SELFATTN_FLASH_UNROLL
      for (int half = 0; half < 2; ++half) {
        const int row = block_row0 + warp_row0 + mt * 16 + group + 8 * half;
        const float rescale = flash_softmax_row<NT, /*WithDropout=*/true>(p, mods, seq, row, key0, in_group, needs_mask,
                                                                          &score[mt][0][2 * half], row_state[mt][half]);
        flash_rescale_row<DT>(&acc[mt][0][2 * half], rescale);
      }
    }

    // ---- O += P V. k-step ks covers keys ks*16..ks*16+15, i.e. S tiles 2ks (A's columns 0-7) and
    // 2ks + 1 (columns 8-15); each C fragment's pair (c0,c1) / (c2,c3) is A's register for row
    // group / group + 8 at the same columns.
    SELFATTN_FLASH_UNROLL
    for (int ks = 0; ks < Traits::kBlockKeys / 16; ++ks) {
      uint32_t p_frag[MT][4];
      SELFATTN_FLASH_UNROLL
      for (int mt = 0; mt < MT; ++mt) {
        const float* lo = score[mt][2 * ks];
        const float* hi = score[mt][2 * ks + 1];
        p_frag[mt][0] = pack2<T>(lo[0], lo[1]);
        p_frag[mt][1] = pack2<T>(lo[2], lo[3]);
        p_frag[mt][2] = pack2<T>(hi[0], hi[1]);
        p_frag[mt][3] = pack2<T>(hi[2], hi[3]);
      }
      SELFATTN_FLASH_UNROLL
      for (int dp = 0; dp < DT / 2; ++dp) {
        // V stored [key][dim]; .trans gives B = V (K x N): {b0, b1} of dim tile 2dp, then 2dp + 1.
        uint32_t v_frag[4];
        ldmatrix_trans<4>(v_frag,
                          v_tile + (ks * 16 + ((lane / 8) % 2) * 8 + lane % 8) * V_RE + dp * 16 + (lane / 16) * 8);
        const uint32_t b_even[2] = {v_frag[0], v_frag[1]}, b_odd[2] = {v_frag[2], v_frag[3]};
        SELFATTN_FLASH_UNROLL
        for (int mt = 0; mt < MT; ++mt) {
          mma_m16n8k16<T>(acc[mt][2 * dp], p_frag[mt], b_even, acc[mt][2 * dp]);
          mma_m16n8k16<T>(acc[mt][2 * dp + 1], p_frag[mt], b_odd, acc[mt][2 * dp + 1]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before the next iteration refills it
  }

  // ---- O / l and LSE.
  T* out = static_cast<T*>(p.out) + batch * p.out_stride_batch + head * p.out_stride_head +
           seq.q_row_start * p.out_stride_row;
  SELFATTN_FLASH_UNROLL
  for (int mt = 0; mt < MT; ++mt)
    SELFATTN_FLASH_UNROLL
    for (int half = 0; half < 2; ++half)
      flash_store_row<T, DT>(p, batch, head, seq, out, block_row0 + warp_row0 + mt * 16 + group + 8 * half, in_group,
                             &acc[mt][0][2 * half], row_state[mt][half]);
}

template <class T, int HeadDimQk, int HeadDimV>
FlashFwdInstance flash_fwd_instance_for() {
  using Traits = typename FlashFwdConfig<HeadDimQk, HeadDimV>::Traits;
  FlashFwdInstance instance;
  instance.kernel = make_kernel_ref<FlashFwdParams, flash_fwd_kernel<T, Traits>>("flash_fwd_kernel");
  instance.block_threads = Traits::kThreads;
  instance.block_rows = Traits::kBlockRows;
  instance.block_keys = Traits::kBlockKeys;
  instance.smem_bytes = Traits::kSmemBytes;
  return instance;
}

// Declared in registry.inc; instances/flash_fwd_*.cu instantiate the shipped (element, head dims).
template <Element E, int HeadDimQk, int HeadDimV>
FlashFwdInstance flash_fwd_instance() {
  return flash_fwd_instance_for<typename FlashElement<E>::Type, HeadDimQk, HeadDimV>();
}

SELFATTN_KERNELS_END
