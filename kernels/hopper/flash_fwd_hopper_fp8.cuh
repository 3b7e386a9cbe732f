#pragma once
// The FP8 (e4m3) fused forward for Hopper (sm_90a): flash_fwd_hopper.cuh's pipeline (a producer
// warpgroup issuing TMA loads into a ring of stages, two consumer warpgroups of 64 query rows with
// ping-pong GEMM issue and S(j) overlapping P(j-1) V(j-1); read that file's comment first) on the
// 8-bit wgmma (m64nNk32, e4m3 x e4m3 -> f32). What differs, and why:
//   - 8-bit wgmma reads both operands K-major (no transpose). Q and K are K-major as stored; for
//     O += P V the B operand must be V^T (keys contiguous), which the pre-pass
//     (transpose_v_fp8.cuh) writes into the workspace: vt_map's boxes are (128 keys, head_dim rows).
//   - P is the A operand straight from S's accumulator registers, four probabilities per register
//     (pack4_e4m3): the keys of each 16-key group then sit in A's columns in a fixed permuted order,
//     and V^T stores its keys in the same order (smem_layout.h, fp8_pv_key: the invariant).
//   - The pre-pass writes zeros for keys from the batch's key length on, so there is no zeroing of
//     the last V tile here (flash_fwd_hopper.cuh's v_ready step); K rows past the keys are masked to
//     -inf by selection as there.
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
#include "../forward/flash_fwd_params.h"
#include "../forward/flash_fwd_sequence.cuh"
#include "../forward/flash_fwd_softmax.cuh"
#include "../launch.h"
#include "flash_fwd_hopper_params.h"
#include "smem_layout.h"

SELFATTN_KERNELS_BEGIN

template <int HeadDim, int BlockKeys, int Stages>
struct FlashFwdHopperFp8Traits {
  static_assert(HeadDim % 128 == 0, "head_dim is a whole number of 128-byte swizzle rows (128 e4m3)");
  static_assert(BlockKeys == 64 || BlockKeys % 128 == 0, "keys per tile: whole V^T swizzle rows (64 or 128 bytes)");
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kBlockKeys = BlockKeys;
  static constexpr int kStages = Stages;
  static constexpr int kConsumerGroups = 2;  // 2 x 64 rows: each K/V tile feeds two warpgroups
  static constexpr int kGroupRows = 64;      // wgmma's M
  static constexpr int kBlockRows = kConsumerGroups * kGroupRows;
  static constexpr int kThreads = 128 * (1 + kConsumerGroups);
  static constexpr int kConsumerThreads = 128 * kConsumerGroups;
  static constexpr int kColumnBlocks = HeadDim / 128;  // TMA boxes per Q or K tile (128 one-byte columns)
  // V^T's rows are the tile's keys: 128 bytes (128-byte swizzle) from 128 keys on, else 64 (64-byte).
  static constexpr int kVtRowBytes = BlockKeys < 128 ? BlockKeys : 128;
  static constexpr int kKeyBlocks = BlockKeys / kVtRowBytes;  // TMA boxes per V^T tile
  // The setmaxnreg budget rule of flash_fwd_hopper.cuh: ptxas gives each thread kLaunchRegisters under
  // __launch_bounds__(kThreads, 1); the counts moved must fit that pool exactly or less.
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;  // 168 for 384 threads
  static constexpr int kProducerRegisters = 24;   // one thread issues copies
  static constexpr int kConsumerRegisters = 240;  // S + O + P: 64 + 64 + 16 (d128), 32 + 128 + 8 (d256)
  static_assert(kProducerRegisters * 128 + kConsumerRegisters * kConsumerThreads <= kLaunchRegisters * kThreads,
                "setmaxnreg asks for more registers than the launch gives the block: the consumers' inc would hang");
  static constexpr uint32_t kQBytes = uint32_t(kBlockRows) * HeadDim;
  static constexpr uint32_t kKTileBytes = uint32_t(BlockKeys) * HeadDim;
  static constexpr uint32_t kVtTileBytes = uint32_t(HeadDim) * BlockKeys;
  static_assert(kQBytes % 1024 == 0 && kKTileBytes % 1024 == 0 && kVtTileBytes % 1024 == 0,
                "tiles keep 1024-byte alignment (the 128-byte swizzle's period)");
  static constexpr uint32_t kKOffset = kQBytes;
  static constexpr uint32_t kVOffset = kKOffset + kStages * kKTileBytes;
  static constexpr uint32_t kBarrierOffset = kVOffset + kStages * kVtTileBytes;
  static constexpr int kBarriers = 4 + 4 * kStages;  // q_full, (unused), turn[2], {k,v}_full[s], {k,v}_empty[s]
  static constexpr size_t kSmemBytes = kBarrierOffset + 8 * kBarriers;
  static_assert(kSmemBytes <= 227 * 1024, "fits the H200's shared memory per block");
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

// S = Q K^T for the warpgroup's 64 rows, k32 steps along the head dim.
template <class Traits>
__device__ __forceinline__ void hopper_fp8_issue_scores(float (&score)[Traits::kBlockKeys / 2], uint32_t q_address,
                                                        int group_row0, uint32_t k_address) {
  SELFATTN_FLASH_UNROLL
  for (int ks = 0; ks < Traits::kHeadDim / 32; ++ks) {
    wgmma_ss_e4m3<Traits::kBlockKeys>(score, k_major_desc_8bit(q_address, Traits::kBlockRows, group_row0, 32 * ks),
                                      k_major_desc_8bit(k_address, Traits::kBlockKeys, 0, 32 * ks), ks > 0);
  }
  wgmma_commit();
}

// O += P V^T's transpose: k32 step kk covers the tile's keys 32kk..32kk+31 (in fp8_pv_key's order).
template <class Traits>
__device__ __forceinline__ void hopper_fp8_issue_pv(float (&acc)[Traits::kHeadDim / 2],
                                                    const uint32_t (&p_frag)[Traits::kBlockKeys / 32][4],
                                                    uint32_t vt_address) {
  SELFATTN_FLASH_UNROLL
  for (int kk = 0; kk < Traits::kBlockKeys / 32; ++kk) {
    wgmma_rs_e4m3<Traits::kHeadDim>(
        acc, p_frag[kk], k_major_desc_8bit(vt_address, Traits::kHeadDim, 0, 32 * kk, Traits::kVtRowBytes), true);
  }
  wgmma_commit();
}

// The probabilities as P V's A operand: register r of k32 step m, byte b, is S register
// fp8_p_score_index(m, r, b) rounded to e4m3 (smem_layout.h states the permutation this makes).
template <int BlockKeys>
__device__ __forceinline__ void hopper_fp8_pack_probabilities(uint32_t (&p_frag)[BlockKeys / 32][4],
                                                              const float (&score)[BlockKeys / 2]) {
  SELFATTN_FLASH_UNROLL
  for (int m = 0; m < BlockKeys / 32; ++m) {
    SELFATTN_FLASH_UNROLL
    for (int r = 0; r < 4; ++r) {
      p_frag[m][r] = pack4_e4m3(score[fp8_p_score_index(m, r, 0)], score[fp8_p_score_index(m, r, 1)],
                                score[fp8_p_score_index(m, r, 2)], score[fp8_p_score_index(m, r, 3)]);
    }
  }
}

template <class TOut, class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_fwd_hopper_fp8_kernel(const __grid_constant__ FlashFwdHopperFp8Params hp) {
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
  const int kv_head = head / p.heads_per_kv_head;

  unsigned char* smem = dynamic_smem<unsigned char>();
  uint64_t* barriers = reinterpret_cast<uint64_t*>(smem + Traits::kBarrierOffset);
  uint64_t* q_full = barriers;      // Q landed (count 1 + tx)
  uint64_t* turn = barriers + 2;    // turn[c]: consumer c may issue its next GEMMs (count 128)
  uint64_t* k_full = barriers + 4;  // K of stage s landed (count 1 + tx)
  uint64_t* v_full = k_full + S;    // V^T of stage s landed (count 1 + tx)
  uint64_t* k_empty = v_full + S;   // K of stage s read by every consumer thread (count kConsumerThreads)
  uint64_t* v_empty = k_empty + S;  // V^T likewise
  if (threadIdx.x == 0) {
    mbarrier_init(q_full, 1);
    for (int c = 0; c < Traits::kConsumerGroups; ++c) mbarrier_init(&turn[c], 128);
    for (int s = 0; s < S; ++s) {
      mbarrier_init(&k_full[s], 1);
      mbarrier_init(&v_full[s], 1);
      mbarrier_init(&k_empty[s], Traits::kConsumerThreads);
      mbarrier_init(&v_empty[s], Traits::kConsumerThreads);
    }
    fence_barrier_init();
  }
  __syncthreads();  // the last block-wide barrier: the warpgroups go their own ways from here

  const int warpgroup = int(threadIdx.x) / 128;
  if (warpgroup == 0) {
    // ---------------------------------------- producer ----------------------------------------
    setmaxnreg_dec<Traits::kProducerRegisters>();
    if (threadIdx.x != 0 || key_tiles == 0) return;
    mbarrier_arrive_expect_tx(q_full, Traits::kQBytes);
    for (int c = 0; c < Traits::kColumnBlocks; ++c)
      tma_load_4d(smem + c * Traits::kBlockRows * 128, &hp.q_map, 128 * c, int32_t(seq.q_row_start + block_row0), head,
                  batch, q_full);
    for (int tile = 0; tile < key_tiles; ++tile) {
      const int s = tile % S, round = tile / S;
      const int key = first_key + tile * BN;  // from the sequence's first key (no varlen: row = key)
      unsigned char* k_stage = smem + Traits::kKOffset + s * Traits::kKTileBytes;
      unsigned char* v_stage = smem + Traits::kVOffset + s * Traits::kVtTileBytes;
      // K first: the consumers need K(j) one P V earlier than V(j). Round 0 waits on the phase
      // "before" the first, which passes at once.
      mbarrier_wait(&k_empty[s], (round & 1) ^ 1);
      mbarrier_arrive_expect_tx(&k_full[s], Traits::kKTileBytes);
      for (int c = 0; c < Traits::kColumnBlocks; ++c)
        tma_load_4d(k_stage + c * BN * 128, &hp.k_map, 128 * c, key, kv_head, batch, &k_full[s]);
      mbarrier_wait(&v_empty[s], (round & 1) ^ 1);
      mbarrier_arrive_expect_tx(&v_full[s], Traits::kVtTileBytes);
      for (int c = 0; c < Traits::kKeyBlocks; ++c)
        tma_load_4d(v_stage + c * D * Traits::kVtRowBytes, &hp.vt_map, key + Traits::kVtRowBytes * c, 0, kv_head, batch,
                    &v_full[s]);
    }
    return;
  }

  // ----------------------------------------- consumers -----------------------------------------
  setmaxnreg_inc<Traits::kConsumerRegisters>();
  const int consumer = warpgroup - 1;  // rows consumer*64 .. +63 of the block
  const int thread = int(threadIdx.x) % 128;
  const int lane = thread % 32, warp = thread / 32;  // warp w of the warpgroup holds rows 16w..16w+15
  const int group = lane / 4, in_group = lane % 4;   // accumulator fragment coordinates
  const int group_row0 = consumer * Traits::kGroupRows;
  const int row0 = block_row0 + group_row0 + warp * 16 + group;  // this thread's rows: row0, row0 + 8
  const HeadScoreMods mods = head_score_mods(p.mods, batch, head);
  const int descale_index = batch * hp.kv_heads + kv_head;
  const float qk_descale = (hp.q_descale != nullptr ? hp.q_descale[descale_index] : 1.0f) *
                           (hp.k_descale != nullptr ? hp.k_descale[descale_index] : 1.0f);
  const uint32_t q_address = smem_address(smem);
  auto k_address = [&](int tile) { return q_address + Traits::kKOffset + (tile % S) * Traits::kKTileBytes; };
  auto v_address = [&](int tile) { return q_address + Traits::kVOffset + (tile % S) * Traits::kVtTileBytes; };
  // Batches of GEMM issue alternate between the consumers (flash_fwd_hopper.cuh).
  int batches = 0;
  auto take_turn = [&] { mbarrier_wait(&turn[consumer], (batches & 1) ^ (consumer == 0 ? 1 : 0)); };
  auto pass_turn = [&] {
    mbarrier_arrive(&turn[1 - consumer]);
    ++batches;
  };

  FlashRowState row_state[2] = {flash_row_start(), flash_row_start()};
  float acc[D / 2];  // O, the accumulator fragment (D / 8 column tiles)
  SELFATTN_FLASH_UNROLL
  for (int i = 0; i < D / 2; ++i) acc[i] = 0.0f;
  float score[BN / 2];          // S of the newest tile, then its probabilities
  uint32_t p_frag[BN / 32][4];  // P of the previous tile in e4m3, the A operand of its P V

  // The softmax of tile `tile` on `score` (S landed, as stored): the true scores first.
  auto softmax = [&](int tile, float (&rescale)[2]) {
    if (qk_descale != 1.0f) {
      SELFATTN_FLASH_UNROLL
      for (int i = 0; i < BN / 2; ++i) score[i] *= qk_descale;
    }
    const int key0 = first_key + tile * BN;
    const bool needs_mask = !flash_tile_unmasked(block_keys, key0, BN);
    SELFATTN_FLASH_UNROLL
    for (int half = 0; half < 2; ++half)
      rescale[half] = flash_softmax_row<BN / 8, /*WithDropout=*/false>(p, mods, seq, row0 + 8 * half, key0, in_group,
                                                                       needs_mask, score + 2 * half, row_state[half]);
  };

  if (key_tiles > 0) {
    mbarrier_wait(q_full, 0);
    // Tile 0: S alone (no P V before it); O is zero, so its factor is not needed.
    mbarrier_wait(&k_full[0], 0);
    take_turn();
    wgmma_fence();
    hopper_fp8_issue_scores<Traits>(score, q_address, group_row0, k_address(0));
    pass_turn();
    wgmma_wait<0>();
    wgmma_fence_operands(score);
    mbarrier_arrive(&k_empty[0]);
    float rescale[2];
    softmax(0, rescale);
    hopper_fp8_pack_probabilities<BN>(p_frag, score);
  }
  for (int tile = 1; tile < key_tiles; ++tile) {
    const int previous = tile - 1;
    mbarrier_wait(&k_full[tile % S], (tile / S) & 1);
    mbarrier_wait(&v_full[previous % S], (previous / S) & 1);
    take_turn();
    wgmma_fence();  // score, acc and p_frag were last written by ordinary instructions
    hopper_fp8_issue_scores<Traits>(score, q_address, group_row0, k_address(tile));
    hopper_fp8_issue_pv<Traits>(acc, p_frag, v_address(previous));
    pass_turn();
    wgmma_wait<1>();  // S(tile) is done; P(previous) V(previous) may still run
    wgmma_fence_operands(score);
    mbarrier_arrive(&k_empty[tile % S]);
    float rescale[2];
    softmax(tile, rescale);
    wgmma_wait<0>();  // O and p_frag are the registers' own again
    wgmma_fence_operands(acc);
    wgmma_fence_operands(p_frag);
    mbarrier_arrive(&v_empty[previous % S]);
    SELFATTN_FLASH_UNROLL
    for (int half = 0; half < 2; ++half) flash_rescale_row<D / 8>(acc + 2 * half, rescale[half]);
    // Packed only now, straight into p_frag (flash_fwd_hopper.cuh: packing earlier made ptxas
    // serialize the wgmmas).
    hopper_fp8_pack_probabilities<BN>(p_frag, score);
  }
  if (key_tiles > 0) {
    // The last tile's P V.
    const int last = key_tiles - 1;
    mbarrier_wait(&v_full[last % S], (last / S) & 1);
    take_turn();
    wgmma_fence();
    hopper_fp8_issue_pv<Traits>(acc, p_frag, v_address(last));
    pass_turn();
    wgmma_wait<0>();
    wgmma_fence_operands(acc);
    wgmma_fence_operands(p_frag);
    mbarrier_arrive(&v_empty[last % S]);
  }

  // ---- O * v_descale / l and LSE (flash_fwd_softmax.cuh).
  const float v_descale = hp.v_descale != nullptr ? hp.v_descale[descale_index] : 1.0f;
  if (v_descale != 1.0f) {
    SELFATTN_FLASH_UNROLL
    for (int i = 0; i < D / 2; ++i) acc[i] *= v_descale;
  }
  TOut* out = static_cast<TOut*>(p.out) + batch * p.out_stride_batch + head * p.out_stride_head +
              seq.q_row_start * p.out_stride_row;
  SELFATTN_FLASH_UNROLL
  for (int half = 0; half < 2; ++half)
    flash_store_row<TOut, D / 8>(p, batch, head, seq, out, row0 + 8 * half, in_group, acc + 2 * half, row_state[half]);
}

template <class TOut, int HeadDim>
FlashFwdHopperInstance flash_fwd_hopper_fp8_instance_for() {
  using Traits = typename FlashFwdHopperFp8Config<HeadDim>::Traits;
  FlashFwdHopperInstance instance;
  instance.kernel = make_kernel_ref<FlashFwdHopperFp8Params, flash_fwd_hopper_fp8_kernel<TOut, Traits>>(
      "flash_fwd_hopper_fp8_kernel");
  instance.block_threads = Traits::kThreads;
  instance.block_rows = Traits::kBlockRows;
  instance.block_keys = Traits::kBlockKeys;
  instance.smem_bytes = Traits::kSmemBytes;
  return instance;
}

// Declared in registry.inc; instances/flash_fwd_hopper_e4m3.cu instantiates the shipped pairs
// (E: out's element, f16 or bf16; q, k, v are e4m3).
template <Element E, int HeadDim>
FlashFwdHopperInstance flash_fwd_hopper_fp8_instance() {
  return flash_fwd_hopper_fp8_instance_for<typename FlashElement<E>::Type, HeadDim>();
}

SELFATTN_KERNELS_END
