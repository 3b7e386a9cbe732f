#pragma once
// Parameters of the fused backward kernels (flash_bwd_dkdv.cuh, flash_bwd_dq.cuh). Plain data, the
// same for nvcc and the host compiler.
//
// The forward call being differentiated is described by the forward's own parameters (`fwd`: q, k,
// v and their strides, the varlen metadata, the mask, the score modifiers, the scale, and in
// fwd.lse the forward's LSE, read here), so the backward reuses the forward's sequence and mask
// helpers (flash_fwd_sequence.cuh) as they are. fwd.out is unused.
//
// Row layout of D, the LSE and the dQ accumulator: query row `row` of (batch b, head h) is entry
//   b * fwd.lse_stride_batch + h * fwd.lse_stride_head + q_row_start(b) + row
// (the LSE's layout: [batch, heads, seq_q], varlen [heads, total_q]); the accumulator holds
// head_dim floats per entry.
#include <cstddef>
#include <cstdint>

#include "../forward/flash_fwd_params.h"
#include "../launch.h"
#include "../params.h"

namespace selfattn::kernels {

struct FlashBwdParams {
  FlashFwdParams fwd;

  const void* dout;  // q's element type, out's shape
  int64_t dout_stride_batch, dout_stride_head, dout_stride_row;
  const float* d;    // D = rowsum(dO * O), the LSE's layout

  // Non-deterministic mode: fp32 dQ accumulator (zeroed before the dK/dV kernel, which adds
  // sum_j dS_ij k_j into it with atomics; not yet times the scale). Null: the dK/dV kernel leaves
  // dQ to flash_bwd_dq.cuh.
  float* dq_accum;

  // Gradients, each in q's element type or f32 (`*_element`), head_dim stride 1. dq is written by
  // flash_bwd_dq.cuh only.
  void* dq;
  void* dk;
  void* dv;
  Element dq_element, dk_element, dv_element;
  int64_t dq_stride_batch, dq_stride_head, dq_stride_row;
  int64_t dk_stride_batch, dk_stride_head, dk_stride_row;
  int64_t dv_stride_batch, dv_stride_head, dv_stride_row;
};

// What the host needs to launch one instance.
struct FlashBwdInstance {
  KernelRef kernel;
  int block_threads = 0;
  int block_tile = 0;  // dK/dV kernel: keys per block (grid.x = ceil(seq_k / block_tile)); dQ kernel: query rows
  // The other side's tile, which the block loops over (not used to launch: tests size calls around
  // the tiles by it): dK/dV kernel: query rows per staged Q/dO tile; dQ kernel: keys per K/V tile.
  int loop_tile = 0;
  size_t smem_bytes = 0;
};

}  // namespace selfattn::kernels
