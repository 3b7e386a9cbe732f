#pragma once
// Fused attention forward for Hopper (sm_90a): FlashAttention-2's algorithm on the Hopper
// instructions, warp-specialised as FlashAttention-3 does it. f16 or bf16 in, fp32 accumulation;
// the same masks, modifiers, GQA, varlen and LSE as flash_fwd.cuh (both use flash_fwd_sequence.cuh
// and score_mods.cuh), so the two kernels differ only in how tiles move and multiply.
//
// One block computes 128 query rows of one (batch, head) with three warpgroups:
//   - warpgroup 0, the producer, gives up its registers (setmaxnreg) and one thread of it issues
//     TMA loads: the Q tile once, then K and V tiles into a ring of kStages stages. K and V of a
//     stage have barriers of their own, so S = Q K^T can start before V has landed and K is
//     refilled as soon as S is done: k_full[s] / v_full[s] (the producer's expect-tx arrival plus
//     the TMA bytes) and k_empty[s] / v_empty[s] (one arrival per consumer thread once its
//     warpgroup's wgmmas have read the tile).
//   - warpgroups 1 and 2, the consumers, take the registers and each own 64 query rows: per key
//     tile, S = Q K^T (wgmma, both operands in shared memory), the online softmax in registers, and
//     O += P V (wgmma with P from registers: the wgmma accumulator fragment of S is, per warp,
//     exactly the A fragment P needs, as with mma.sync).
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
// Tiles are stored as TMA lands them with the 128-byte swizzle: head_dim / 64 column blocks of
// rows x 128 bytes (kernels/hopper/smem_layout.h, checked against CuTe's GMMA layouts).
//
// Rows a tile box covers past the sequence's keys are another sequence's (varlen) or padding past
// a key length: they may hold anything, NaN included, and P = 0 times NaN is NaN. The tile that
// holds them (the last one) has its V rows zeroed by the producer warp after it lands, behind a
// further barrier (v_ready); K rows need nothing (their scores are masked to -inf by selection).
// Rows past the tensor's end arrive as zeros from the TMA itself.
//
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
  // setmaxnreg moves registers within the block's pool, which is what the launch gave it: ptxas
  // allocates kLaunchRegisters per thread under __launch_bounds__(kThreads, 1). An inc that the
  // pool cannot meet waits forever (PTX ISA, setmaxnreg), so the counts must fit it exactly or less.
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;  // 168 for 384 threads
  static constexpr int kProducerRegisters = 24;   // one thread issues copies (a few bytes of spill there)
  static constexpr int kConsumerRegisters = 240;  // the rest: 24 * 128 + 240 * 256 = 168 * 384
  static_assert(kProducerRegisters * 128 + kConsumerRegisters * kConsumerThreads <= kLaunchRegisters * kThreads,
                "setmaxnreg asks for more registers than the launch gives the block: the consumers' inc would hang");
  static constexpr uint32_t kQBytes = uint32_t(kBlockRows) * HeadDim * 2;
  static constexpr uint32_t kKVTileBytes = uint32_t(BlockKeys) * HeadDim * 2;
  // Every tile starts on 1024 bytes, the 128-byte swizzle's period (its sizes are multiples of it).
  static_assert(kQBytes % 1024 == 0 && kKVTileBytes % 1024 == 0, "tiles keep 1024-byte alignment");
  static constexpr uint32_t kKOffset = kQBytes;
  static constexpr uint32_t kVOffset = kKOffset + kStages * kKVTileBytes;
  static constexpr uint32_t kBarrierOffset = kVOffset + kStages * kKVTileBytes;
  static constexpr int kBarriers = 4 + 4 * kStages;  // q_full, v_ready, turn[2], {k,v}_full[s], {k,v}_empty[s]
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

// The GEMMs of one consumer warpgroup, each issued as one committed group (all 128 threads).
// S = Q K^T for the warpgroup's 64 rows: score[4t + i] is the C fragment of keys 8t..8t+7.
template <class T, class Traits>
__device__ __forceinline__ void hopper_issue_scores(float (&score)[Traits::kBlockKeys / 2], uint32_t q_address,
                                                    int group_row0, uint32_t k_address) {
  SELFATTN_FLASH_UNROLL
  for (int ks = 0; ks < Traits::kHeadDim / 16; ++ks) {
    wgmma_ss<T, Traits::kBlockKeys>(score, k_major_desc(q_address, Traits::kBlockRows, group_row0, 16 * ks),
                                    k_major_desc(k_address, Traits::kBlockKeys, 0, 16 * ks), ks > 0);
  }
  wgmma_commit();
}

// O += P V, V MN-major: k-step kk covers keys 16kk..16kk+15.
template <class T, class Traits>
__device__ __forceinline__ void hopper_issue_pv(float (&acc)[Traits::kHeadDim / 2],
                                                const uint32_t (&p_frag)[Traits::kBlockKeys / 16][4], uint32_t v_address) {
  SELFATTN_FLASH_UNROLL
  for (int kk = 0; kk < Traits::kBlockKeys / 16; ++kk) {
    wgmma_rs<T, Traits::kHeadDim, /*TransposeB=*/1>(acc, p_frag[kk], mn_major_desc(v_address, Traits::kBlockKeys, 16 * kk),
                                                    true);
  }
  wgmma_commit();
}

// The probabilities as P V's A operand: k-step kk is S's column tiles 2kk (A's columns 0-7) and
// 2kk + 1 (8-15); each C pair (c0,c1) / (c2,c3) is A's register for row group / group + 8.
template <class T, int BlockKeys>
__device__ __forceinline__ void hopper_pack_probabilities(uint32_t (&p_frag)[BlockKeys / 16][4],
                                                          const float (&score)[BlockKeys / 2]) {
  SELFATTN_FLASH_UNROLL
  for (int kk = 0; kk < BlockKeys / 16; ++kk) {
    const float* lo = score + 4 * (2 * kk);
    const float* hi = score + 4 * (2 * kk + 1);
    p_frag[kk][0] = pack2<T>(lo[0], lo[1]);
    p_frag[kk][1] = pack2<T>(lo[2], lo[3]);
    p_frag[kk][2] = pack2<T>(hi[0], hi[1]);
    p_frag[kk][3] = pack2<T>(hi[2], hi[3]);
  }
}

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
  uint64_t* q_full = barriers;         // Q landed (count 1 + tx)
  uint64_t* v_ready = barriers + 1;    // the last tile's V rows past the keys are zeroed (count 32)
  uint64_t* turn = barriers + 2;       // turn[c]: consumer c may issue its next GEMMs (count 128)
  uint64_t* k_full = barriers + 4;     // K of stage s landed (count 1 + tx)
  uint64_t* v_full = k_full + S;       // V of stage s landed (count 1 + tx)
  uint64_t* k_empty = v_full + S;      // K of stage s read by every consumer thread (count kConsumerThreads)
  uint64_t* v_empty = k_empty + S;     // V likewise
  if (threadIdx.x == 0) {
    mbarrier_init(q_full, 1);
    mbarrier_init(v_ready, 32);
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
        // K first: the consumers need K(j) one P V earlier than V(j). Round 0 waits on the phase
        // "before" the first, which passes at once.
        mbarrier_wait(&k_empty[s], (round & 1) ^ 1);
        mbarrier_arrive_expect_tx(&k_full[s], Traits::kKVTileBytes);
        for (int c = 0; c < Traits::kColumnBlocks; ++c)
          tma_load_4d(k_stage + c * BN * 128, &hp.k_map, 64 * c, key_row, kv_head, batch_coord, &k_full[s]);
        mbarrier_wait(&v_empty[s], (round & 1) ^ 1);
        mbarrier_arrive_expect_tx(&v_full[s], Traits::kKVTileBytes);
        for (int c = 0; c < Traits::kColumnBlocks; ++c)
          tma_load_4d(v_stage + c * BN * 128, &hp.v_map, 64 * c, key_row, kv_head, batch_coord, &v_full[s]);
      }
      if (tile == key_tiles - 1 && zero_last_v) {
        // Lane 0 has followed every phase of v_full[s]; the other lanes learn of this one from it.
        if (lane == 0) mbarrier_wait(&v_full[s], round & 1);
        __syncwarp();
        // Whole 128-byte rows: the swizzle only permutes 16-byte chunks inside a row.
        const int rows = BN - zero_from;
        for (int i = lane; i < Traits::kColumnBlocks * rows * 8; i += 32) {
          const int c = i / (rows * 8), row = zero_from + i / 8 % rows, chunk = i % 8;
          store_vector(reinterpret_cast<uint4*>(v_stage + c * BN * 128 + row * 128 + chunk * 16), uint4{0, 0, 0, 0});
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
  const int row0 = block_row0 + group_row0 + warp * 16 + group;  // this thread's rows: row0, row0 + 8
  const HeadScoreMods mods = head_score_mods(p.mods, batch, head);
  const uint32_t q_address = smem_address(smem);
  auto k_address = [&](int tile) { return q_address + Traits::kKOffset + (tile % S) * Traits::kKVTileBytes; };
  auto v_address = [&](int tile) { return q_address + Traits::kVOffset + (tile % S) * Traits::kKVTileBytes; };
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
  float acc[D / 2];  // O, the accumulator fragment (D / 8 column tiles)
  SELFATTN_FLASH_UNROLL
  for (int i = 0; i < D / 2; ++i) acc[i] = 0.0f;
  float score[BN / 2];           // S of the newest tile, then its probabilities
  uint32_t p_frag[BN / 16][4];   // P of the previous tile, the A operand of its P V

  // The softmax of tile `tile` on `score` (S landed); returns each row's factor for O.
  auto softmax = [&](int tile, float (&rescale)[2]) {
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
    hopper_issue_scores<T, Traits>(score, q_address, group_row0, k_address(0));
    pass_turn();
    wgmma_wait<0>();
    wgmma_fence_operands(score);
    mbarrier_arrive(&k_empty[0]);
    float rescale[2];
    softmax(0, rescale);
    hopper_pack_probabilities<T, BN>(p_frag, score);
  }
  for (int tile = 1; tile < key_tiles; ++tile) {
    const int previous = tile - 1;
    mbarrier_wait(&k_full[tile % S], (tile / S) & 1);
    mbarrier_wait(&v_full[previous % S], (previous / S) & 1);
    take_turn();
    wgmma_fence();  // score, acc and p_frag were last written by ordinary instructions
    hopper_issue_scores<T, Traits>(score, q_address, group_row0, k_address(tile));
    hopper_issue_pv<T, Traits>(acc, p_frag, v_address(previous));
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
    // P(tile) is packed only now, straight into p_frag. Packing it earlier, into registers of its
    // own while P(previous) V(previous) still ran, and copying it over here saved registers, but
    // ptxas then gave the packed P the registers of the P V in flight and serialized every wgmma
    // of the kernel (warning C7513, each wgmma waiting for the one before): the pipelining gone.
    hopper_pack_probabilities<T, BN>(p_frag, score);
  }
  if (key_tiles > 0) {
    // The last tile's P V.
    const int last = key_tiles - 1;
    mbarrier_wait(&v_full[last % S], (last / S) & 1);
    if (zero_last_v) mbarrier_wait(v_ready, 0);
    take_turn();
    wgmma_fence();
    hopper_issue_pv<T, Traits>(acc, p_frag, v_address(last));
    pass_turn();
    wgmma_wait<0>();
    wgmma_fence_operands(acc);
    wgmma_fence_operands(p_frag);
    mbarrier_arrive(&v_empty[last % S]);
  }

  // ---- O / l and LSE (flash_fwd_softmax.cuh).
  T* out = static_cast<T*>(p.out) + batch * p.out_stride_batch + head * p.out_stride_head +
           seq.q_row_start * p.out_stride_row;
  SELFATTN_FLASH_UNROLL
  for (int half = 0; half < 2; ++half)
    flash_store_row<T, D / 8>(p, batch, head, seq, out, row0 + 8 * half, in_group, acc + 2 * half, row_state[half]);
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
