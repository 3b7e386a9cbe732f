#pragma once
// Fused attention forward for Hopper (sm_90a): FlashAttention-2's algorithm on the Hopper
// instructions, warp-specialised as FlashAttention-3 does it. f16 or bf16 in, fp32 accumulation;
// the same masks, modifiers, GQA, varlen and LSE as flash_fwd.cuh (both use flash_fwd_sequence.cuh
// and score_mods.cuh), so the two kernels differ only in how tiles move and multiply.
//
// One block computes 128 query rows of one (batch, head) with three warpgroups:
//   - warpgroup 0, the producer, gives up its registers (setmaxnreg) and one thread of it issues
//     TMA loads: the Q tile once, then K and V tiles into a ring of kStages stages. Stage s is
//     guarded by two mbarriers: full[s] (the producer's expect-tx arrival plus the TMA bytes) and
//     empty[s] (one arrival per consumer thread once its warpgroup's wgmmas have read the stage).
//   - warpgroups 1 and 2, the consumers, take the registers and each own 64 query rows: per key
//     tile, S = Q K^T (wgmma, both operands in shared memory), the online softmax in registers, and
//     O += P V (wgmma with P from registers: the wgmma accumulator fragment of S is, per warp,
//     exactly the A fragment P needs, as with mma.sync).
// Tiles are stored as TMA lands them with the 128-byte swizzle: head_dim / 64 column blocks of
// rows x 128 bytes (kernels/hopper/smem_layout.h, checked against CuTe's GMMA layouts).
//
// Rows a tile box covers past the sequence's keys are another sequence's (varlen) or padding past
// a key length: they may hold anything, NaN included, and P = 0 times NaN is NaN. The tile that
// holds them (the last one) has its V rows zeroed by the producer warp after it lands, behind a
// third barrier (v_ready); K rows need nothing (their scores are masked to -inf by selection).
// Rows past the tensor's end arrive as zeros from the TMA itself.
//
// Not yet here (bench/NOTES.md): overlapping the softmax of one tile with the GEMMs of the next
// (intra-warpgroup pipelining) and the two consumer warpgroups' ping-pong; each GEMM is waited
// for before the softmax that needs it.
//
// Written with this project's primitives (primitives_hopper.cuh) rather than CuTe: the kernel reads
// as the algorithm, and every instruction has a sim twin the tests check against CuTe's layouts.
#include <cstdint>

#include "../common/compat.h"
#include "../common/primitives.cuh"
#include "../common/primitives_hopper.cuh"
#include "../flash_fwd_params.h"
#include "../flash_fwd_sequence.cuh"
#include "../launch.h"
#include "flash_fwd_hopper_params.h"
#include "smem_layout.h"

SELFATTN_KERNELS_BEGIN

template <int HeadDim, int BlockKeys, int Stages>
struct FlashFwdHopperTraits {
  static_assert(HeadDim % 64 == 0, "head_dim is a whole number of 128-byte swizzle rows (64 elements)");
  static_assert(BlockKeys % 16 == 0 && BlockKeys <= 256, "keys per tile: whole P V k-steps, one TMA box");
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kBlockKeys = BlockKeys;
  static constexpr int kStages = Stages;
  static constexpr int kConsumerGroups = 2;                 // 2 x 64 rows: each K/V tile feeds two warpgroups
  static constexpr int kGroupRows = 64;                     // wgmma's M
  static constexpr int kBlockRows = kConsumerGroups * kGroupRows;
  static constexpr int kThreads = 128 * (1 + kConsumerGroups);
  static constexpr int kConsumerThreads = 128 * kConsumerGroups;
  static constexpr int kColumnBlocks = HeadDim / 64;        // TMA boxes per tile
  static constexpr int kProducerRegisters = 40;             // one thread issues copies; a warp zeroes a tile
  static constexpr int kConsumerRegisters = 232;            // 40 * 128 + 232 * 256 <= 64K registers
  static constexpr uint32_t kQBytes = uint32_t(kBlockRows) * HeadDim * 2;
  static constexpr uint32_t kKVTileBytes = uint32_t(BlockKeys) * HeadDim * 2;
  // Every tile starts on 1024 bytes, the 128-byte swizzle's period (its sizes are multiples of it).
  static_assert(kQBytes % 1024 == 0 && kKVTileBytes % 1024 == 0, "tiles keep 1024-byte alignment");
  static constexpr uint32_t kKOffset = kQBytes;
  static constexpr uint32_t kVOffset = kKOffset + kStages * kKVTileBytes;
  static constexpr uint32_t kBarrierOffset = kVOffset + kStages * kKVTileBytes;
  static constexpr int kBarriers = 2 + 2 * kStages;         // q_full, v_ready, full[s], empty[s]
  static constexpr size_t kSmemBytes = kBarrierOffset + 8 * kBarriers;
  static_assert(kSmemBytes <= 227 * 1024, "fits the H200's shared memory per block");
};

// The configuration of each shipped head dim (the only place tile sizes are chosen).
template <int HeadDim>
struct FlashFwdHopperConfig;
// D = 64, 128: 128-key tiles, two stages (80 KB / 160 KB). Per consumer thread S and O hold 64 + 32
// or 64 + 64 floats.
template <> struct FlashFwdHopperConfig<64> { using Traits = FlashFwdHopperTraits<64, 128, 2>; };
template <> struct FlashFwdHopperConfig<128> { using Traits = FlashFwdHopperTraits<128, 128, 2>; };
// D = 256: O alone is 128 floats per thread; 64-key tiles (S 32 floats), two stages (192 KB).
template <> struct FlashFwdHopperConfig<256> { using Traits = FlashFwdHopperTraits<256, 64, 2>; };

template <class T, class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1) flash_fwd_hopper_kernel(const __grid_constant__ FlashFwdHopperParams hp) {
  constexpr int D = Traits::kHeadDim;
  constexpr int BN = Traits::kBlockKeys;
  constexpr int S = Traits::kStages;
  const FlashFwdParams& p = hp.base;

  const int batch = blockIdx.z, head = blockIdx.y;
  const FlashSequence seq = flash_sequence(p, batch);
  // Query tiles in reverse: under a causal mask the last tiles see the most keys (flash_fwd.cuh).
  const int block_row0 = int(gridDim.x - 1 - blockIdx.x) * Traits::kBlockRows;
  if (block_row0 >= seq.q_len) return;  // the whole block, before any barrier
  const int block_q_rows = seq.q_len - block_row0 < Traits::kBlockRows ? seq.q_len - block_row0 : Traits::kBlockRows;
  const FlashBlockKeys block_keys = flash_block_keys(p, seq, block_row0, block_q_rows, BN);
  const int key_tiles = block_keys.end_tile - block_keys.first_tile;
  const int first_key = block_keys.first_tile * BN;

  unsigned char* smem = dynamic_smem<unsigned char>();
  uint64_t* barriers = reinterpret_cast<uint64_t*>(smem + Traits::kBarrierOffset);
  uint64_t* q_full = barriers;       // Q landed (count 1 + tx)
  uint64_t* v_ready = barriers + 1;  // the last tile's V rows past the keys are zeroed (count 32)
  uint64_t* full = barriers + 2;     // stage s landed (count 1 + tx)
  uint64_t* empty = barriers + 2 + S;  // stage s read by every consumer thread (count kConsumerThreads)
  if (threadIdx.x == 0) {
    mbarrier_init(q_full, 1);
    mbarrier_init(v_ready, 32);
    for (int s = 0; s < S; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], Traits::kConsumerThreads);
    }
    fence_barrier_init();
  }
  __syncthreads();  // the last block-wide barrier: the warpgroups go their own ways from here

  // The last tile's V rows from `zero_from` on lie past the sequence's keys but inside the tensor.
  const int last_key0 = first_key + (key_tiles - 1) * BN;
  const bool zero_last_v =
      key_tiles > 0 && last_key0 + BN > seq.k_len && seq.k_row_start + seq.k_len < int64_t(hp.k_map_rows);
  const int zero_from = seq.k_len - last_key0;
  const int batch_coord = p.cu_seqlens_q != nullptr ? 0 : batch;  // varlen maps have one "batch"

  const int warpgroup = int(threadIdx.x) / 128;
  if (warpgroup == 0) {
    // ---------------------------------------- producer ----------------------------------------
    setmaxnreg_dec<Traits::kProducerRegisters>();
    if (threadIdx.x >= 32 || key_tiles == 0) return;
    const int lane = int(threadIdx.x);
    const int kv_head = head / p.heads_per_kv_head;
    if (lane == 0) {
      mbarrier_arrive_expect_tx(q_full, Traits::kQBytes);
      for (int c = 0; c < Traits::kColumnBlocks; ++c)
        tma_load_4d(smem + c * Traits::kBlockRows * 128, &hp.q_map, 64 * c, int32_t(seq.q_row_start + block_row0), head,
                    batch_coord, q_full);
    }
    for (int tile = 0; tile < key_tiles; ++tile) {
      const int s = tile % S, round = tile / S;
      const int key_row = int32_t(seq.k_row_start + first_key + tile * BN);
      unsigned char* k_stage = smem + Traits::kKOffset + s * Traits::kKVTileBytes;
      unsigned char* v_stage = smem + Traits::kVOffset + s * Traits::kKVTileBytes;
      if (lane == 0) {
        mbarrier_wait(&empty[s], (round & 1) ^ 1);  // round 0: the phase "before" the first passes at once
        mbarrier_arrive_expect_tx(&full[s], 2 * Traits::kKVTileBytes);
        for (int c = 0; c < Traits::kColumnBlocks; ++c) {
          tma_load_4d(k_stage + c * BN * 128, &hp.k_map, 64 * c, key_row, kv_head, batch_coord, &full[s]);
          tma_load_4d(v_stage + c * BN * 128, &hp.v_map, 64 * c, key_row, kv_head, batch_coord, &full[s]);
        }
      }
      if (tile == key_tiles - 1 && zero_last_v) {
        // Lane 0 has followed every phase of full[s]; the other lanes learn of this one from it.
        if (lane == 0) mbarrier_wait(&full[s], round & 1);
        __syncwarp();
        // Whole 128-byte rows: the swizzle only permutes 16-byte chunks inside a row.
        const int rows = BN - zero_from;
        for (int i = lane; i < Traits::kColumnBlocks * rows * 8; i += 32) {
          const int c = i / (rows * 8), row = zero_from + i / 8 % rows, chunk = i % 8;
          *reinterpret_cast<uint4*>(v_stage + c * BN * 128 + row * 128 + chunk * 16) = uint4{0, 0, 0, 0};
        }
        fence_proxy_async();  // the zeros are read by wgmma (the async proxy)
        mbarrier_arrive(v_ready);
      }
    }
    return;
  }

  // ----------------------------------------- consumers -----------------------------------------
  setmaxnreg_inc<Traits::kConsumerRegisters>();
  const int consumer = warpgroup - 1;       // rows consumer*64 .. +63 of the block
  const int thread = int(threadIdx.x) % 128;
  const int lane = thread % 32, warp = thread / 32;  // warp w of the warpgroup holds rows 16w..16w+15
  const int group = lane / 4, in_group = lane % 4;   // accumulator fragment coordinates
  const int group_row0 = consumer * Traits::kGroupRows;
  const HeadScoreMods mods = head_score_mods(p.mods, batch, head);
  const uint32_t q_address = smem_address(smem);

  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
  float acc[D / 2];
  SELFATTN_FLASH_UNROLL
  for (int i = 0; i < D / 2; ++i) acc[i] = 0.0f;

  if (key_tiles > 0) mbarrier_wait(q_full, 0);
  for (int tile = 0; tile < key_tiles; ++tile) {
    const int s = tile % S, round = tile / S;
    const int key0 = first_key + tile * BN;
    const uint32_t k_address = q_address + Traits::kKOffset + s * Traits::kKVTileBytes;
    const uint32_t v_address = q_address + Traits::kVOffset + s * Traits::kKVTileBytes;
    mbarrier_wait(&full[s], round & 1);

    // ---- S = Q K^T for this warpgroup's 64 rows; score[4nt + i] is the C fragment of keys nt*8...
    float score[BN / 2];
    wgmma_fence();
    SELFATTN_FLASH_UNROLL
    for (int ks = 0; ks < D / 16; ++ks) {
      wgmma_ss<T, BN>(score, k_major_desc(q_address, Traits::kBlockRows, group_row0, 16 * ks),
                      k_major_desc(k_address, BN, 0, 16 * ks), ks > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();

    // ---- online softmax (flash_fwd.cuh's, on one m-tile per warp).
    const bool needs_mask = !flash_tile_unmasked(block_keys, key0, BN);
    SELFATTN_FLASH_UNROLL
    for (int half = 0; half < 2; ++half) {
      const int row = block_row0 + group_row0 + warp * 16 + group + 8 * half;
      const KeyRange seen = needs_mask ? flash_visible_keys(p, seq, row) : KeyRange{0, 0};
      const int aligned = aligned_row(row, seq.q_len, seq.k_len, p.causal);
      float tile_max = -INFINITY;
      SELFATTN_FLASH_UNROLL
      for (int nt = 0; nt < BN / 8; ++nt) {
        SELFATTN_FLASH_UNROLL
        for (int j = 0; j < 2; ++j) {
          float& x = score[4 * nt + 2 * half + j];
          const int key = key0 + nt * 8 + 2 * in_group + j;
          if (needs_mask && (key < seen.begin || key >= seen.end)) {
            x = -INFINITY;
          } else if (p.mods.changes_values) {
            x = modified_score(p.mods, mods, x * p.scale, row, aligned, key) * kLog2e;
          } else {
            x *= p.scale_log2;
          }
          tile_max = fmaxf(tile_max, x);
        }
      }
      const float new_max = fmaxf(row_max[half], warp_reduce_max<4>(tile_max));
      const float shift = new_max == -INFINITY ? 0.0f : new_max;  // a row that saw no key yet
      const float rescale = exp2f(row_max[half] - shift);
      row_max[half] = new_max;
      float sum = 0.0f;
      SELFATTN_FLASH_UNROLL
      for (int nt = 0; nt < BN / 8; ++nt) {
        SELFATTN_FLASH_UNROLL
        for (int j = 0; j < 2; ++j) {
          float& x = score[4 * nt + 2 * half + j];
          x = exp2f(x - shift);
          sum += x;
        }
      }
      row_sum[half] = row_sum[half] * rescale + sum;
      if (rescale != 1.0f) {
        SELFATTN_FLASH_UNROLL
        for (int dt = 0; dt < D / 8; ++dt) {
          acc[4 * dt + 2 * half] *= rescale;
          acc[4 * dt + 2 * half + 1] *= rescale;
        }
      }
    }

    // ---- O += P V: k-step kk covers keys 16kk..16kk+15, S's n8 tiles 2kk and 2kk + 1.
    uint32_t p_frag[BN / 16][4];
    SELFATTN_FLASH_UNROLL
    for (int kk = 0; kk < BN / 16; ++kk) {
      const float* lo = score + 4 * (2 * kk);
      const float* hi = score + 4 * (2 * kk + 1);
      p_frag[kk][0] = pack2<T>(lo[0], lo[1]);
      p_frag[kk][1] = pack2<T>(lo[2], lo[3]);
      p_frag[kk][2] = pack2<T>(hi[0], hi[1]);
      p_frag[kk][3] = pack2<T>(hi[2], hi[3]);
    }
    if (tile == key_tiles - 1 && zero_last_v) mbarrier_wait(v_ready, 0);
    wgmma_fence();
    SELFATTN_FLASH_UNROLL
    for (int kk = 0; kk < BN / 16; ++kk) {
      wgmma_rs<T, D, /*TransposeB=*/1>(acc, p_frag[kk], mn_major_desc(v_address, BN, 16 * kk), true);
    }
    wgmma_commit();
    wgmma_wait<0>();
    mbarrier_arrive(&empty[s]);  // this thread's warpgroup has read stage s
  }

  // ---- O / l and LSE. A row without visible keys has l = 0 and O = 0: it writes 0 and -inf.
  T* out = static_cast<T*>(p.out) + batch * p.out_stride_batch + head * p.out_stride_head +
           seq.q_row_start * p.out_stride_row;
  SELFATTN_FLASH_UNROLL
  for (int half = 0; half < 2; ++half) {
    const float sum = warp_reduce_sum<4>(row_sum[half]);
    const int row = block_row0 + group_row0 + warp * 16 + group + 8 * half;
    if (row >= seq.q_len) continue;
    const float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
    T* out_row = out + row * p.out_stride_row;
    SELFATTN_FLASH_UNROLL
    for (int dt = 0; dt < D / 8; ++dt) {
      const uint32_t pair = pack2<T>(acc[4 * dt + 2 * half] * inv_sum, acc[4 * dt + 2 * half + 1] * inv_sum);
      *reinterpret_cast<uint32_t*>(out_row + dt * 8 + 2 * in_group) = pair;
    }
    if (p.lse != nullptr && in_group == 0) {
      const float lse = sum > 0.0f ? (row_max[half] + log2f(sum)) * 0.69314718055994531f : -INFINITY;
      p.lse[batch * p.lse_stride_batch + head * p.lse_stride_head + seq.q_row_start + row] = lse;
    }
  }
}

template <class T, int HeadDim>
FlashFwdHopperInstance flash_fwd_hopper_instance_for() {
  using Traits = typename FlashFwdHopperConfig<HeadDim>::Traits;
  FlashFwdHopperInstance instance;
  instance.kernel = make_kernel_ref<FlashFwdHopperParams, flash_fwd_hopper_kernel<T, Traits>>("flash_fwd_hopper_kernel");
  instance.block_threads = Traits::kThreads;
  instance.block_rows = Traits::kBlockRows;
  instance.block_keys = Traits::kBlockKeys;
  instance.smem_bytes = Traits::kSmemBytes;
  return instance;
}

// Declared in registry.inc; instances/flash_fwd_hopper_*.cu instantiate the shipped pairs.
template <Element E, int HeadDim>
FlashFwdHopperInstance flash_fwd_hopper_instance() {
  return flash_fwd_hopper_instance_for<typename FlashElement<E>::Type, HeadDim>();
}

SELFATTN_KERNELS_END
