#pragma once
// The Hopper (sm_90a) fused forward's pipeline, written once for every operand type: FlashAttention-2's
// algorithm on the Hopper instructions, warp-specialised as FlashAttention-3 does it (whose one
// mainloop likewise serves fp16, bf16 and fp8). The kernels are short policy files around it:
//   flash_fwd_hopper.cuh      f16 / bf16 q, k, v (16-bit wgmma)
//   flash_fwd_hopper_fp8.cuh  e4m3 q, k, v with f16 / bf16 out (8-bit wgmma, V^T from a pre-pass)
// Both have the masks, modifiers, GQA and LSE of flash_fwd.cuh (flash_fwd_sequence.cuh and
// flash_fwd_softmax.cuh, shared), so the kernels differ from it only in how tiles move and multiply.
//
// One block computes 128 query rows of one (batch, head) with three warpgroups:
//   - warpgroup 0, the producer, gives up its registers (setmaxnreg) and one thread of it issues
//     TMA loads: the Q tile once, then K and V tiles into a ring of kStages stages. K and V of a
//     stage have barriers of their own, so S = Q K^T can start before V has landed and K is
//     refilled as soon as S is done.
//   - warpgroups 1 and 2, the consumers, take the registers and each own 64 query rows: per key
//     tile, S = Q K^T (wgmma, both operands in shared memory), the online softmax in registers, and
//     O += P V (wgmma with P from registers: the wgmma accumulator fragment of S holds, per thread,
//     the scores the A fragment of P V wants, so P is packed without shuffles).
// The tensor cores are kept busy while the consumers do softmax, in two ways (FlashAttention-3's):
//   - within a warpgroup, S(j) is issued together with P(j-1) V(j-1) and waited for first, so the
//     softmax of tile j runs while P(j-1) V(j-1) is still in the tensor cores. O is rescaled by
//     tile j's factor only after that product is done (wgmma owns O while it is in flight). Each
//     wait is followed by wgmma_fence_operands on what it retired, so the compiler neither reads
//     S or O early nor reuses P's registers while wgmma reads them. No ordinary instruction may
//     write a register of a wgmma in flight, or ptxas serializes every wgmma of the kernel (its
//     info C7513; ctest flash_fwd_hopper_*.wgmma_pipelined guards it).
//   - between the two consumer warpgroups, the issue of each batch of GEMMs takes turns (two
//     mbarriers, turn[0] and turn[1], ping-pong), so one warpgroup's softmax overlaps the other's
//     GEMMs instead of both competing for the tensor cores at once. mbarriers rather than named
//     barriers (bar.sync id): the sim models them strictly, phases and deadlocks included.
// Tiles are stored as TMA lands them with the 128-byte swizzle (kernels/hopper/smem_layout.h,
// checked against CuTe's GMMA layouts). Rows a K tile's box covers past the sequence's keys need
// nothing: their scores are masked to -inf by selection. V rows there are another sequence's
// (varlen) or padding past a key length: anything, NaN included, and P = 0 times NaN is NaN, so
// the policy keeps them out of P V (the 16-bit one zeroes them here, behind v_ready; the FP8
// pre-pass writes zeros). Rows past the tensor's end arrive as zeros from the TMA itself.
//
// The operand policy (a struct; the kernel files define one each) is everything that depends on
// the operands' type:
//   Traits, Params, Out      the tile sizes (FlashFwdHopperPipelineTraits below), the kernel's
//                            parameters (q_map, k_map, base, and what loads V), out's element type
//   kPvSteps                 k-steps of one tile's P V: P is uint32_t[kPvSteps][4] (A fragments)
//   kVarlen                  varlen calls reach it (sequences are row ranges of the maps' one batch)
//   kZeroesVTail             the producer warp zeroes the last tile's V rows past the keys:
//                            last_v_needs_zeros(hp, seq, key_tiles, last_key0) says when,
//                            zero_v_tail(v_stage, zero_from, lane) makes the stores
//   load_v                   the TMA loads of one V (or V^T) tile
//   issue_scores, issue_pv   the wgmmas of S = Q K^T and O += P V, each one committed group
//   pack_probabilities       S's fp32 probabilities to P's A fragments
//   Descales, load_descales  what the descale steps need, read once per consumer thread
//   descale_scores           a landed S as stored to the true scores, before the softmax (FP8)
//   descale_out              O's own factor, after the last P V (FP8: v_descale)
// Written with this project's primitives (primitives_hopper.cuh) rather than CuTe: the kernel reads
// as the algorithm, and every instruction has a sim twin the tests check against CuTe's layouts.
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

// The block's shape and shared memory, for ElementBytes-byte q, k and v: Q and K rows of HeadDimQk
// elements, V and O rows of HeadDimV (MLA's prefill: 192 and 128). Each kernel's traits derive from
// this and add their own constraints; their Config picks BlockKeys and Stages per head-dim pair.
template <int HeadDimQk, int HeadDimV, int BlockKeys, int Stages, int ElementBytes>
struct FlashFwdHopperPipelineTraits {
  static constexpr int kHeadDimQk = HeadDimQk;  // the k of S = Q K^T
  static constexpr int kHeadDimV = HeadDimV;    // the n of O += P V
  static constexpr int kBlockKeys = BlockKeys;  // keys per K/V tile: S is kBlockKeys / 2 floats per consumer thread
  static constexpr int kStages = Stages;        // K/V tiles in flight: the producer runs this far ahead
  static constexpr int kElementBytes = ElementBytes;
  static constexpr int kConsumerGroups = 2;  // 2 x 64 rows: each K/V tile feeds two warpgroups
  static constexpr int kGroupRows = 64;      // wgmma's M
  static constexpr int kBlockRows = kConsumerGroups * kGroupRows;
  static constexpr int kThreads = 128 * (1 + kConsumerGroups);  // the producer warpgroup, then the consumers
  static constexpr int kConsumerThreads = 128 * kConsumerGroups;
  static constexpr int kBoxColumns = 128 / ElementBytes;  // a Q, K or V TMA box's width: one 128-byte swizzle row
  static_assert(HeadDimQk % kBoxColumns == 0 && HeadDimV % kBoxColumns == 0,
                "both head dims are whole numbers of 128-byte swizzle rows");
  static constexpr int kQkColumnBlocks = HeadDimQk / kBoxColumns;  // TMA boxes per Q or K tile
  static constexpr int kVColumnBlocks = HeadDimV / kBoxColumns;    // TMA boxes per V tile (16-bit)
  // setmaxnreg moves registers within the block's pool, which is what the launch gave it: ptxas
  // allocates kLaunchRegisters per thread under __launch_bounds__(kThreads, 1). An inc that the
  // pool cannot meet waits forever (PTX ISA, setmaxnreg), so the counts must fit it exactly or less.
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;  // 168 for 384 threads
  static constexpr int kProducerRegisters = 24;   // one thread issues copies (16-bit: a few bytes of spill there)
  // The rest, 24 * 128 + 240 * 256 = 168 * 384: S + O + P, e.g. 64 + 64 + 32 (16-bit d128), 32 + 128 + 8 (FP8 d256).
  static constexpr int kConsumerRegisters = 240;
  static_assert(kProducerRegisters * 128 + kConsumerRegisters * kConsumerThreads <= kLaunchRegisters * kThreads,
                "setmaxnreg asks for more registers than the launch gives the block: the consumers' inc would hang");
  static constexpr uint32_t kQBytes = uint32_t(kBlockRows) * HeadDimQk * ElementBytes;
  static constexpr uint32_t kKTileBytes = uint32_t(BlockKeys) * HeadDimQk * ElementBytes;
  static constexpr uint32_t kVTileBytes = uint32_t(BlockKeys) * HeadDimV * ElementBytes;  // a V or V^T tile
  // Every tile starts on 1024 bytes, the 128-byte swizzle's period (its sizes are multiples of it).
  static_assert(kQBytes % 1024 == 0 && kKTileBytes % 1024 == 0 && kVTileBytes % 1024 == 0,
                "tiles keep 1024-byte alignment");
  static constexpr uint32_t kKOffset = kQBytes;
  static constexpr uint32_t kVOffset = kKOffset + kStages * kKTileBytes;
  static constexpr uint32_t kBarrierOffset = kVOffset + kStages * kVTileBytes;
  static constexpr int kBarriers = 4 + 4 * kStages;  // q_full, v_ready, turn[2], {k,v}_full[s], {k,v}_empty[s]
  static constexpr size_t kSmemBytes = kBarrierOffset + 8 * kBarriers;
  static_assert(kSmemBytes <= 227 * 1024, "fits the H200's shared memory per block");
};

// The whole kernel body; each kernel file's __global__ function is this on its policy.
template <class Policy>
__device__ __forceinline__ void flash_fwd_hopper_pipeline(const typename Policy::Params& hp) {
  using Traits = typename Policy::Traits;
  using Out = typename Policy::Out;
  constexpr int DV = Traits::kHeadDimV;  // O's columns
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

  // Which barrier protects which buffer. "full": the producer's expect-tx arrival plus the TMA
  // bytes; "empty": one arrival per consumer thread once its warpgroup's wgmmas have read the tile.
  unsigned char* smem = dynamic_smem<unsigned char>();
  uint64_t* barriers = reinterpret_cast<uint64_t*>(smem + Traits::kBarrierOffset);
  uint64_t* q_full = barriers;         // Q landed (count 1 + tx); Q is never refilled
  uint64_t* v_ready = barriers + 1;    // the last tile's V rows past the keys are zeroed (count 32; kZeroesVTail)
  uint64_t* turn = barriers + 2;       // turn[c]: consumer c may issue its next GEMMs (count 128)
  uint64_t* k_full = barriers + 4;     // K of stage s landed (count 1 + tx)
  uint64_t* v_full = k_full + S;       // V (or V^T) of stage s landed (count 1 + tx)
  uint64_t* k_empty = v_full + S;      // K of stage s read by every consumer thread (count kConsumerThreads)
  uint64_t* v_empty = k_empty + S;     // V likewise
  if (threadIdx.x == 0) {
    mbarrier_init(q_full, 1);
    if constexpr (Policy::kZeroesVTail) mbarrier_init(v_ready, 32);
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

  // The last tile's V rows from `zero_from` on lie past the sequence's keys; with zero_last_v they
  // lie inside the tensor too, and the producer zeroes them (policies with kZeroesVTail).
  const int last_key0 = first_key + (key_tiles - 1) * BN;
  bool zero_last_v = false;
  if constexpr (Policy::kZeroesVTail) zero_last_v = Policy::last_v_needs_zeros(hp, seq, key_tiles, last_key0);
  const int zero_from = seq.k_len - last_key0;
  const int batch_coord = Policy::kVarlen && p.cu_seqlens_q != nullptr ? 0 : batch;  // varlen maps have one "batch"

  const int warpgroup = int(threadIdx.x) / 128;
  if (warpgroup == 0) {
    // ---------------------------------------- producer ----------------------------------------
    setmaxnreg_dec<Traits::kProducerRegisters>();
    // Lane 0 issues every copy; a policy that zeroes V's tail keeps the whole warp for its stores.
    constexpr int kProducerLanes = Policy::kZeroesVTail ? 32 : 1;
    if (threadIdx.x >= kProducerLanes || key_tiles == 0) return;
    const int lane = int(threadIdx.x);
    if (lane == 0) {
      mbarrier_arrive_expect_tx(q_full, Traits::kQBytes);
      for (int c = 0; c < Traits::kQkColumnBlocks; ++c)
        tma_load_4d(smem + c * Traits::kBlockRows * 128, &hp.q_map, Traits::kBoxColumns * c,
                    int32_t(seq.q_row_start + block_row0), head, batch_coord, q_full);
    }
    for (int tile = 0; tile < key_tiles; ++tile) {
      const int s = tile % S, round = tile / S;
      const int key = first_key + tile * BN;
      const int key_row = Policy::kVarlen ? int32_t(seq.k_row_start + key) : key;  // the key's row in k's map
      unsigned char* k_stage = smem + Traits::kKOffset + s * Traits::kKTileBytes;
      unsigned char* v_stage = smem + Traits::kVOffset + s * Traits::kVTileBytes;
      if (lane == 0) {
        // K first: the consumers need K(j) one P V earlier than V(j). Round 0 waits on the phase
        // "before" the first, which passes at once.
        mbarrier_wait(&k_empty[s], (round & 1) ^ 1);
        mbarrier_arrive_expect_tx(&k_full[s], Traits::kKTileBytes);
        for (int c = 0; c < Traits::kQkColumnBlocks; ++c)
          tma_load_4d(k_stage + c * BN * 128, &hp.k_map, Traits::kBoxColumns * c, key_row, kv_head, batch_coord,
                      &k_full[s]);
        mbarrier_wait(&v_empty[s], (round & 1) ^ 1);
        mbarrier_arrive_expect_tx(&v_full[s], Traits::kVTileBytes);
        Policy::load_v(v_stage, hp, key_row, kv_head, batch_coord, &v_full[s]);
      }
      if constexpr (Policy::kZeroesVTail) {
        if (tile == key_tiles - 1 && zero_last_v) {
          // Lane 0 has followed every phase of v_full[s]; the other lanes learn of this one from it.
          if (lane == 0) mbarrier_wait(&v_full[s], round & 1);
          __syncwarp();
          Policy::zero_v_tail(v_stage, zero_from, lane);
          fence_proxy_async();  // the zeros are read by wgmma (the async proxy)
          mbarrier_arrive(v_ready);
        }
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
  const int row0 = block_row0 + group_row0 + warp * 16 + group;  // this thread's rows: row0, row0 + 8
  const HeadScoreMods mods = head_score_mods(p.mods, batch, head);
  const typename Policy::Descales descales = Policy::load_descales(hp, batch, kv_head);
  const uint32_t q_address = smem_address(smem);
  auto k_address = [&](int tile) { return q_address + Traits::kKOffset + (tile % S) * Traits::kKTileBytes; };
  auto v_address = [&](int tile) { return q_address + Traits::kVOffset + (tile % S) * Traits::kVTileBytes; };
  // Batches of GEMM issue alternate between the consumers: consumer 0 issues its batch b once
  // consumer 1 has issued b - 1 (its first at once), consumer 1 its batch b once consumer 0 has
  // issued b. Both issue key_tiles + 1 batches, so the last turn passed is never waited for.
  int batches = 0;
  auto take_turn = [&] { mbarrier_wait(&turn[consumer], (batches & 1) ^ (consumer == 0 ? 1 : 0)); };
  auto pass_turn = [&] {
    mbarrier_arrive(&turn[1 - consumer]);
    ++batches;
  };

  FlashRowState row_state[2] = {flash_row_start(), flash_row_start()};
  float acc[DV / 2];  // O, the accumulator fragment (DV / 8 column tiles)
  SELFATTN_FLASH_UNROLL
  for (int i = 0; i < DV / 2; ++i) acc[i] = 0.0f;
  float score[BN / 2];                     // S of the newest tile, then its probabilities
  uint32_t p_frag[Policy::kPvSteps][4];    // P of the previous tile, the A operand of its P V

  // The softmax of tile `tile` on `score` (S landed, as stored: the true scores first); returns
  // each row's factor for O.
  auto softmax = [&](int tile, float (&rescale)[2]) {
    Policy::descale_scores(descales, score);
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
    Policy::issue_scores(score, q_address, group_row0, k_address(0));
    pass_turn();
    wgmma_wait<0>();
    wgmma_fence_operands(score);
    mbarrier_arrive(&k_empty[0]);  // this thread's warpgroup is done with K(0): a refill may follow
    float rescale[2];
    softmax(0, rescale);
    Policy::pack_probabilities(p_frag, score);
  }
  for (int tile = 1; tile < key_tiles; ++tile) {
    const int previous = tile - 1;
    mbarrier_wait(&k_full[tile % S], (tile / S) & 1);
    mbarrier_wait(&v_full[previous % S], (previous / S) & 1);
    take_turn();
    wgmma_fence();  // score, acc and p_frag were last written by ordinary instructions
    Policy::issue_scores(score, q_address, group_row0, k_address(tile));
    Policy::issue_pv(acc, p_frag, v_address(previous));
    pass_turn();
    wgmma_wait<1>();  // S(tile) is done; P(previous) V(previous) may still run
    wgmma_fence_operands(score);
    mbarrier_arrive(&k_empty[tile % S]);
    float rescale[2];
    softmax(tile, rescale);
    wgmma_wait<0>();  // O and p_frag are the registers' own again
    wgmma_fence_operands(acc);
    wgmma_fence_operands(p_frag);
    mbarrier_arrive(&v_empty[previous % S]);  // V(previous) read: its stage may be refilled
    SELFATTN_FLASH_UNROLL
    for (int half = 0; half < 2; ++half) flash_rescale_row<DV / 8>(acc + 2 * half, rescale[half]);
    // P(tile) is packed only now, straight into p_frag. Packing it earlier, into registers of its
    // own while P(previous) V(previous) still ran, and copying it over here saved registers, but
    // ptxas then gave the packed P the registers of the P V in flight and serialized every wgmma
    // of the kernel (warning C7513, each wgmma waiting for the one before): the pipelining gone.
    Policy::pack_probabilities(p_frag, score);
  }
  if (key_tiles > 0) {
    // The last tile's P V.
    const int last = key_tiles - 1;
    mbarrier_wait(&v_full[last % S], (last / S) & 1);
    if (zero_last_v) mbarrier_wait(v_ready, 0);  // and its rows past the keys zeroed (generic stores, fenced)
    take_turn();
    wgmma_fence();
    Policy::issue_pv(acc, p_frag, v_address(last));
    pass_turn();
    wgmma_wait<0>();
    wgmma_fence_operands(acc);
    wgmma_fence_operands(p_frag);
    mbarrier_arrive(&v_empty[last % S]);
  }

  // ---- O / l and LSE (flash_fwd_softmax.cuh), O's own factor first (FP8: v_descale).
  Policy::descale_out(hp, descales, acc);
  Out* out = static_cast<Out*>(p.out) + batch * p.out_stride_batch + head * p.out_stride_head +
             seq.q_row_start * p.out_stride_row;
  SELFATTN_FLASH_UNROLL
  for (int half = 0; half < 2; ++half)
    flash_store_row<Out, DV / 8>(p, batch, head, seq, out, row0 + 8 * half, in_group, acc + 2 * half, row_state[half]);
}

// The launch facts of one kernel instance (registry.inc's flash_fwd_hopper*_instance).
template <class Traits, class Params, void (*Kernel)(Params)>
FlashFwdHopperInstance flash_fwd_hopper_instance_of(const char* name) {
  FlashFwdHopperInstance instance;
  instance.kernel = make_kernel_ref<Params, Kernel>(name);
  instance.block_threads = Traits::kThreads;
  instance.block_rows = Traits::kBlockRows;
  instance.block_keys = Traits::kBlockKeys;
  instance.smem_bytes = Traits::kSmemBytes;
  return instance;
}

SELFATTN_KERNELS_END
