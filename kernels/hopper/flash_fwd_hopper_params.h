#pragma once
// Parameters of the Hopper fused forward (flash_fwd_hopper.cuh): the mma.sync kernel's
// FlashFwdParams (same addressing, masks and modifiers) plus the three TMA tensor maps the host
// encodes for q, k and v. Passed as a __grid_constant__ kernel parameter: the TMA unit reads the
// maps where the parameter lives, so they must not be copied to registers or local memory.
//
// Each map is 4-D, innermost first: (head_dim, rows, heads, batch), strides in bytes from the view;
// varlen views have batch extent 1 (sequences are row ranges). The box is (64, block rows) for q and
// (64, block keys) for k and v: 64 16-bit elements is the 128-byte swizzle's row, so a tile of
// head_dim columns arrives as head_dim / 64 boxes (kernels/hopper/smem_layout.h).
#include "../common/tma_descriptor.h"
#include "../forward/flash_fwd_params.h"
#include "../launch.h"

namespace selfattn::kernels {

struct FlashFwdHopperParams {
  TmaDescriptor q_map, k_map, v_map;  // first: 64-byte aligned at the start of the parameter
  FlashFwdParams base;
  int k_map_rows;  // extent of k/v's row dimension in the maps (seq_k, or total_k for varlen)
};

struct FlashFwdHopperInstance {
  KernelRef kernel;
  int block_threads = 0;
  int block_rows = 0;  // query rows per block: grid.x = ceil(seq_q / block_rows); q's box rows
  int block_keys = 0;  // keys per tile: k's and v's box rows
  size_t smem_bytes = 0;
};

}  // namespace selfattn::kernels
