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

// The FP8 (e4m3) forward (flash_fwd_hopper_fp8.cuh). q and k as above with 1-byte elements and
// boxes of 128 columns (128 bytes, the swizzle's row); vt_map is over the V^T buffer the pre-pass
// (transpose_v_fp8.cuh) writes into the workspace: (keys_padded, head_dim, kv_heads, batch), box
// (128 keys, head_dim rows). The descales are fp32 [batch, kv_heads] (AttentionOptions::q_descale),
// null for 1.
struct FlashFwdHopperFp8Params {
  TmaDescriptor q_map, k_map, vt_map;  // first: 64-byte aligned at the start of the parameter
  FlashFwdParams base;
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;
  int kv_heads;
};

// The pre-pass: V (e4m3, [batch, kv_heads, seq_k, head_dim] with any row/head/batch strides) to
// vt [batch, kv_heads, head_dim, keys_padded], keys permuted inside each 16-key group and zero from
// the batch's key length on (smem_layout.h, fp8_pv_key).
struct TransposeVFp8Params {
  const void* v;
  int64_t v_stride_batch, v_stride_head, v_stride_row;  // elements (bytes)
  void* vt;
  const int32_t* key_lengths;  // [batch] or null
  int seq_k, keys_padded, head_dim;
};

struct TransposeVFp8Instance {
  KernelRef kernel;
  int keys = 0;  // keys per block: keys_padded is a multiple of it, grid.x = keys_padded / keys
  int threads = 0;
  size_t smem_bytes = 0;
};

}  // namespace selfattn::kernels
