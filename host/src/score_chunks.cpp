#include "score_chunks.h"

#include <algorithm>
#include <string>

#include "selfattn/error.h"

namespace selfattn::detail {
namespace {

// Grid limits of one launch over a chunk: pairs ride on grid z (Q K^T, P V) or y (softmax), rows on
// grid y in 64-row tiles.
constexpr int64_t kMaxPairsPerChunk = 65535;
constexpr int64_t kMaxRowsPerChunk = 65535 * 64;

struct ChunkShape {
  int pairs = 0, rows = 0;
};

ChunkShape shape_for_budget(const AttentionCall& call, size_t row_bytes, size_t budget) {
  const int64_t rows_that_fit = int64_t(budget / row_bytes);
  ChunkShape shape;
  if (rows_that_fit >= call.seq_q) {
    shape.rows = call.seq_q;
    shape.pairs = int(std::min<int64_t>({int64_t(call.batch) * call.heads, rows_that_fit / call.seq_q, kMaxPairsPerChunk}));
  } else {
    shape.rows = int(rows_that_fit);
    shape.pairs = 1;
  }
  shape.rows = int(std::min<int64_t>(shape.rows, kMaxRowsPerChunk));
  return shape;
}

}  // namespace

kernels::Element element_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return kernels::Element::f32;
    case DType::f16: return kernels::Element::f16;
    case DType::bf16: return kernels::Element::bf16;
  }
  return kernels::Element::f32;
}

kernels::KeyMask key_mask(const AttentionCall& call) {
  static_assert(int(Causal::top_left) == int(kernels::CausalMask::top_left) &&
                    int(Causal::bottom_right) == int(kernels::CausalMask::bottom_right),
                "CausalMask mirrors selfattn::Causal");
  return {call.key_lengths, static_cast<kernels::CausalMask>(call.causal), call.seq_q};
}

void for_each_chunk(ContextState& ctx, const AttentionCall& call, const ScoreLayout& layout,
                    const std::function<void(const Chunk&, void* workspace)>& run_chunk) {
  const size_t limit = ctx.workspace.limit();
  if (layout.row_bytes > limit) {
    throw WorkspaceTooSmall("attention: one query row of scores needs " + std::to_string(layout.row_bytes) +
                            " bytes (seq_k " + std::to_string(call.seq_k) + ") but the workspace limit is " +
                            std::to_string(limit) +
                            " bytes; raise ContextOptions::workspace_limit or Context::set_workspace_limit");
  }
  // Other workspace slots may hold part of the limit; the largest chunk that fits is found by halving.
  size_t budget = limit;
  ChunkShape shape;
  void* workspace = nullptr;
  for (;;) {
    shape = shape_for_budget(call, layout.row_bytes, budget);
    try {
      workspace = ctx.workspace.reserve(size_t(shape.pairs) * shape.rows * layout.row_bytes, "attention scores S/P");
      break;
    } catch (const WorkspaceTooSmall&) {
      if (budget <= layout.row_bytes) throw;
      budget = std::max(layout.row_bytes, budget / 2);
    }
  }

  const int pairs_total = call.batch * call.heads;
  for (int pair = 0; pair < pairs_total; pair += shape.pairs) {
    for (int row = 0; row < call.seq_q; row += shape.rows) {
      Chunk chunk;
      chunk.pair_begin = pair;
      chunk.pairs = std::min(shape.pairs, pairs_total - pair);
      chunk.row_begin = row;
      chunk.rows = std::min(shape.rows, call.seq_q - row);
      run_chunk(chunk, workspace);
    }
  }
}

void launch_softmax(ContextState& ctx, const AttentionCall& call, const Chunk& chunk, const float* s,
                    int64_t s_row_stride, void* p, kernels::Element p_elem, int64_t p_row_stride, float scale) {
  kernels::SoftmaxKernel softmax;
  if (ctx.device->backend() == Backend::sim) {
    softmax = kernels::sim_target::softmax_rows_instance(p_elem, call.seq_k);
  } else {
#if SELFATTN_HAVE_CUDA
    softmax = kernels::cuda_target::softmax_rows_instance(p_elem, call.seq_k);
#endif
  }
  if (!softmax.kernel) throw NotAvailable("attention: no softmax_rows kernel for this backend");

  kernels::SoftmaxParams params{};
  params.s = s;
  params.p = p;
  params.s_row_stride = s_row_stride;
  params.s_bh_stride = s_row_stride * chunk.rows;
  params.p_row_stride = p_row_stride;
  params.p_bh_stride = p_row_stride * chunk.rows;
  params.lse = call.lse;
  params.mask = key_mask(call);
  params.scale = scale;
  params.heads = call.heads;
  params.bh_begin = chunk.pair_begin;
  params.row_begin = chunk.row_begin;
  params.rows = chunk.rows;
  params.seq_k = call.seq_k;

  kernels::LaunchShape shape;
  shape.grid = dim3(unsigned((chunk.rows + softmax.rows_per_block - 1) / softmax.rows_per_block), unsigned(chunk.pairs));
  shape.block = dim3(unsigned(softmax.threads));
  shape.dynamic_smem_bytes = softmax.smem_bytes;
  ctx.device->launch(softmax.kernel, shape, &params);
}

}  // namespace selfattn::detail
