#pragma once
// Fused attention on CUDA cores, in exact fp32 arithmetic: the fused path for fp32 inputs (which
// tensor cores cannot take without rounding) and for head dims or alignments the tensor-core
// kernel does not cover. Same algorithm as flash_fwd.cuh (one block per (query tile, head, batch),
// online softmax over key tiles, S and P never leave the chip), written for scalar FMAs:
//   - each warp owns kRowsPerWarp query rows; for S, lane n computes the score of key n of the tile
//     for all of them (one K element read from shared memory feeds kRowsPerWarp FMAs);
//   - for O += P V, lane d owns output columns d, d+32, ... and takes P of key n from lane n, which
//     computed it, by a shuffle (P never goes through shared memory).
// head_dim is a runtime value up to kMaxHeadDim; elements are loaded one at a time, so any stride
// and alignment works.
#include <cstdint>

#include "../common/compat.h"
#include "../common/primitives.cuh"
#include "flash_fwd_params.h"
#include "flash_fwd_sequence.cuh"
#include "../launch.h"

SELFATTN_KERNELS_BEGIN

struct FlashFwdSimtTraits {
  static constexpr int kWarps = 4;         // 128 threads: enough warps to hide shared-memory latency
  static constexpr int kRowsPerWarp = 8;   // reuse of each K/V element read; 8x8 accumulators per lane
  static constexpr int kBlockRows = kWarps * kRowsPerWarp;
  static constexpr int kBlockKeys = 32;    // one key per lane when computing S
  static constexpr int kMaxHeadDim = 256;  // kMaxHeadDim / 32 accumulators per row per lane
  static constexpr int kColsPerLane = kMaxHeadDim / 32;
  static constexpr int kThreads = kWarps * 32;

  // Shared memory, in floats: Q [rows][q_cols], K [keys][q_cols + 1], V [keys][d]: 96 KB at d = 256,
  // within the 99 KB per block of the 8.6 and 8.9 GPUs that run the sm_80 build (a P tile as well
  // would take it to 100 KB). Q and K rows are zero-padded to a multiple of 4 columns so S reads Q
  // as float4 broadcasts (4 columns per load); the +1 of K staggers its rows across banks, since
  // lane n reads row n.
  __host__ __device__ static constexpr int q_cols(int head_dim) { return (head_dim + 3) / 4 * 4; }
  __host__ __device__ static constexpr int k_row_floats(int head_dim) { return q_cols(head_dim) + 1; }
  __host__ __device__ static constexpr size_t smem_floats(int head_dim) {
    return size_t(kBlockRows) * q_cols(head_dim) + size_t(kBlockKeys) * k_row_floats(head_dim) +
           size_t(kBlockKeys) * head_dim;
  }
  __host__ __device__ static constexpr size_t smem_bytes(int head_dim) { return smem_floats(head_dim) * sizeof(float); }
};

__device__ inline float flash_simt_load(const float* p, int64_t i) { return p[i]; }
__device__ inline float flash_simt_load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ inline float flash_simt_load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ inline void flash_simt_store(float* p, int64_t i, float x) { p[i] = x; }
__device__ inline void flash_simt_store(__half* p, int64_t i, float x) { p[i] = __float2half_rn(x); }
__device__ inline void flash_simt_store(__nv_bfloat16* p, int64_t i, float x) { p[i] = __float2bfloat16_rn(x); }

template <class Element>
__global__ void __launch_bounds__(FlashFwdSimtTraits::kThreads) flash_fwd_simt_kernel(const FlashFwdParams p) {
  using Traits = FlashFwdSimtTraits;
  constexpr int R = Traits::kRowsPerWarp;
  constexpr int N = Traits::kBlockKeys;
  constexpr int C = Traits::kColsPerLane;

  const int batch = blockIdx.z, head = blockIdx.y;
  const FlashSequence seq = flash_sequence(p, batch);
  // Query tiles in reverse: under a causal mask the last tiles see the most keys, and starting
  // them first leaves the short ones for the tail of the grid.
  const int block_row0 = int(gridDim.x - 1 - blockIdx.x) * Traits::kBlockRows;
  if (block_row0 >= seq.q_len) return;  // varlen: this sequence is shorter than the longest

  const int d = p.head_dim;
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const int kv_head = head / p.heads_per_kv_head;
  const Element* q = static_cast<const Element*>(p.q) + batch * p.q_stride_batch + head * p.q_stride_head +
                     seq.q_row_start * p.q_stride_row;
  const Element* k = static_cast<const Element*>(p.k) + batch * p.k_stride_batch + kv_head * p.k_stride_head +
                     seq.k_row_start * p.k_stride_row;
  const Element* v = static_cast<const Element*>(p.v) + batch * p.v_stride_batch + kv_head * p.v_stride_head +
                     seq.k_row_start * p.v_stride_row;

  float* q_tile = dynamic_smem<float>();
  const int q_cols = Traits::q_cols(d);
  const int k_stride = Traits::k_row_floats(d);
  float* k_tile = q_tile + size_t(Traits::kBlockRows) * q_cols;
  float* v_tile = k_tile + N * k_stride;

  // Q once; rows past the sequence are zero (their scores are finite and never stored).
  for (int i = threadIdx.x; i < Traits::kBlockRows * q_cols; i += Traits::kThreads) {
    const int row = block_row0 + i / q_cols, col = i % q_cols;
    q_tile[i] = row < seq.q_len && col < d ? flash_simt_load(q, row * p.q_stride_row + col) : 0.0f;
  }

  const int block_q_rows = seq.q_len - block_row0 < Traits::kBlockRows ? seq.q_len - block_row0 : Traits::kBlockRows;
  const FlashBlockKeys block_keys = flash_block_keys(p, seq, block_row0, block_q_rows, N);
  const int key_end = block_keys.end_tile * N < seq.k_len ? block_keys.end_tile * N : seq.k_len;

  const int warp_row0 = warp * R;  // within the block
  float row_max[R], row_sum[R], acc[R][C];
  SELFATTN_FLASH_UNROLL
  for (int r = 0; r < R; ++r) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.0f;  // this lane's keys only; the warp's sum is taken once at the end
    SELFATTN_FLASH_UNROLL
    for (int c = 0; c < C; ++c) acc[r][c] = 0.0f;
  }

  // Keys before the sequence's key_start and past its length stage as 0: padding may hold anything.
  for (int key0 = block_keys.first_tile * N; key0 < key_end; key0 += N) {
    __syncthreads();  // the previous tile's K and V are no longer read
    for (int i = threadIdx.x; i < N * q_cols; i += Traits::kThreads) {
      const int key = key0 + i / q_cols, col = i % q_cols;
      k_tile[(i / q_cols) * k_stride + col] =
          key >= seq.keys.begin && key < seq.k_len && col < d ? flash_simt_load(k, key * p.k_stride_row + col) : 0.0f;
    }
    for (int i = threadIdx.x; i < N * d; i += Traits::kThreads) {
      const int key = key0 + i / d, col = i % d;
      v_tile[i] = key >= seq.keys.begin && key < seq.k_len ? flash_simt_load(v, key * p.v_stride_row + col) : 0.0f;
    }
    __syncthreads();

    float score[R];
    SELFATTN_FLASH_UNROLL
    for (int r = 0; r < R; ++r) score[r] = 0.0f;
    for (int c = 0; c < q_cols; c += 4) {
      const float* k_row = k_tile + lane * k_stride + c;
      const float k0 = k_row[0], k1 = k_row[1], k2 = k_row[2], k3 = k_row[3];
      SELFATTN_FLASH_UNROLL
      for (int r = 0; r < R; ++r) {
        const float4 qc = load_vector(reinterpret_cast<const float4*>(q_tile + (warp_row0 + r) * q_cols + c));
        score[r] = fmaf(qc.w, k3, fmaf(qc.z, k2, fmaf(qc.y, k1, fmaf(qc.x, k0, score[r]))));
      }
    }

    float prob[R];  // P of this lane's key, for each of the warp's rows
    SELFATTN_FLASH_UNROLL
    for (int r = 0; r < R; ++r) {
      // The row's range is recomputed per tile rather than held in registers across the loop.
      const int key = key0 + lane, row = block_row0 + warp_row0 + r;
      const KeyRange seen = flash_visible_keys(p, seq, row);
      float s;
      if (key < seen.begin || key >= seen.end) {
        s = -INFINITY;
      } else if (p.mods.changes_values) {
        // The head's slope and bias are looked up here, not held across the loop: registers stay
        // as without modifiers (168 per thread, 3 blocks per SM).
        const HeadScoreMods mods = head_score_mods(p.mods, batch, head);
        const int aligned = aligned_key(row, seq.keys);
        s = modified_score(p.mods, mods, score[r] * p.scale, row, aligned, key) * kLog2e;
      } else {
        s = score[r] * p.scale_log2;
      }
      const float new_max = fmaxf(row_max[r], warp_reduce_max<32>(s));
      // A row that has seen no key yet keeps max -inf; subtracting 0 instead keeps exp2 away from
      // (-inf) - (-inf) and still gives exp2(-inf) = 0 for its masked scores.
      const float shift = new_max == -INFINITY ? 0.0f : new_max;
      const float rescale = exp2f(row_max[r] - shift);
      prob[r] = exp2f(s - shift);
      row_max[r] = new_max;
      row_sum[r] = row_sum[r] * rescale + prob[r];
      // Dropout (dropout.cuh) after the sum: P V takes the kept probabilities, the LSE all of them.
      if (p.mods.dropout_threshold != 0)
        prob[r] = dropout_apply(p.mods, dropout_stream(p.mods, batch, head), row, key, prob[r]);
      SELFATTN_FLASH_UNROLL
      for (int c = 0; c < C; ++c) acc[r][c] *= rescale;
    }

    const int tile_keys = key_end - key0 < N ? key_end - key0 : N;
    for (int n = 0; n < tile_keys; ++n) {  // tile_keys is the warp's: every lane shuffles
      float p_n[R];
      SELFATTN_FLASH_UNROLL
      for (int r = 0; r < R; ++r) p_n[r] = __shfl_sync(0xffffffffu, prob[r], n);
      SELFATTN_FLASH_UNROLL
      for (int c = 0; c < C; ++c) {
        const int col = lane + 32 * c;
        if (col >= d) break;
        const float vn = v_tile[n * d + col];
        SELFATTN_FLASH_UNROLL
        for (int r = 0; r < R; ++r) acc[r][c] = fmaf(p_n[r], vn, acc[r][c]);
      }
    }
  }

  Element* out = static_cast<Element*>(p.out) + batch * p.out_stride_batch + head * p.out_stride_head +
                 seq.q_row_start * p.out_stride_row;
  const float sink = head_sink(p.mods, head);
  SELFATTN_FLASH_UNROLL
  for (int r = 0; r < R; ++r) {
    const int row = block_row0 + warp_row0 + r;
    const float sum = warp_reduce_sum<32>(row_sum[r]);
    if (row >= seq.q_len) continue;
    // A row without keys has sum 0 and accumulators 0: it writes 0 and LSE -inf (or the sink's logit).
    const SoftmaxRowEnd end = softmax_row_end</*Log2=*/true>(row_max[r], sum, sink);
    SELFATTN_FLASH_UNROLL
    for (int c = 0; c < C; ++c) {
      const int col = lane + 32 * c;
      if (col < d) flash_simt_store(out, row * p.out_stride_row + col, acc[r][c] * end.inverse);
    }
    if (p.lse != nullptr && lane == 0) {
      p.lse[batch * p.lse_stride_batch + head * p.lse_stride_head + seq.q_row_start + row] = end.lse;
    }
  }
}

template <class Element>
FlashFwdInstance flash_fwd_simt_instance_for(int head_dim) {
  using Traits = FlashFwdSimtTraits;
  FlashFwdInstance instance;
  instance.kernel = make_kernel_ref<FlashFwdParams, flash_fwd_simt_kernel<Element>>("flash_fwd_simt_kernel");
  instance.block_threads = Traits::kThreads;
  instance.block_rows = Traits::kBlockRows;
  instance.block_keys = Traits::kBlockKeys;
  instance.smem_bytes = Traits::smem_bytes(head_dim);
  return instance;
}

SELFATTN_KERNELS_END
