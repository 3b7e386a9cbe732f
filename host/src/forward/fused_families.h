#pragma once
// The fused path's kernel families (path_fused.cpp runs the first that takes a call), each in a file
// of its own with its kernel list's table:
//   fused_hopper_fp8.cpp  hopper/flash_fwd_hopper_fp8.cuh after its V^T pre-pass: e4m3 q/k/v on sm_90a
//   fused_hopper.cpp      hopper/flash_fwd_hopper.cuh: f16/bf16 on sm_90a (wgmma, TMA)
//   fused_mma.cpp         forward/flash_fwd.cuh: f16/bf16 on tensor cores (mma.sync), every GPU;
//                         forward/flash_fwd_simt.cuh: anything else up to head_dim 256 (exact fp32)
// As CUTLASS's can_implement / run: `takes` decides from the call and the context alone, before
// anything is written; `run` launches.
#include <cstddef>

#include "core/attention_call.h"
#include "kernels/registry.h"
#include "runtime/context_state.h"

namespace selfattn::detail {

struct FusedFamily {
  const char* name;
  // Whether the family's kernel takes this call on this context (its architecture, dtype, head
  // dim, the views' alignment, the options it serves).
  bool (*takes)(const ContextState& ctx, const AttentionCall& call);
  // Runs a call it takes (a varlen call's offsets already ordered); false, with nothing launched,
  // when a view turns out to be one its launch cannot describe (a TMA map's limits): the next
  // family that takes the call runs it instead.
  bool (*run)(ContextState& ctx, const AttentionCall& call, void* workspace);
};

extern const FusedFamily kFusedHopperFp8;
extern const FusedFamily kFusedHopper;
extern const FusedFamily kFusedMma;
extern const FusedFamily kFusedSimt;

// Every fused forward kernel's grid: one block of `threads` per block_rows query rows, per head, per
// sequence.
kernels::LaunchShape query_blocks(const AttentionCall& call, int block_rows, int threads, size_t smem_bytes);

// The Hopper families' TMA map over `view`: a 4-D map (head_dim, rows, heads, batch), boxes of
// box_columns x box_rows, 128-byte swizzle. Varlen views are [1, heads, total, d]: batch extent 1.
kernels::TmaTiledSpec tma_spec_of(const TensorView& view, int box_rows, int box_columns = 64);

// The FP8 family's workspace: its V^T buffer (fused_hopper_fp8.cpp).
size_t hopper_fp8_workspace_bytes(const AttentionCall& call);

}  // namespace selfattn::detail
