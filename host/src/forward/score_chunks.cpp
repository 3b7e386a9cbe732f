#include "forward/score_chunks.h"

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/backend_kernels.h"
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

struct PaddedCall {
  AttentionCall call;
  int64_t lse_pair_stride = 0;
  int sequence = -1;  // of a varlen call, for messages
  int64_t q_row_offset = 0, k_row_offset = 0;  // its first rows in the varlen call's views
};

// A padded call as it is, or each sequence with queries of a variable-length call as a padded call
// of batch 1 on its rows (a sequence without keys gets seq_k 0: its rows must become 0, LSE -inf).
std::vector<PaddedCall> padded_calls(ContextState& ctx, const AttentionCall& call, const char* function) {
  if (!call.varlen()) return {{call, call.seq_q, -1, 0, 0}};
  std::vector<int32_t> cu_q(size_t(call.batch) + 1), cu_k(size_t(call.batch) + 1);
  ctx.device->copy(cu_q.data(), call.cu_seqlens_q, cu_q.size() * sizeof(int32_t), /*async=*/false);
  ctx.device->copy(cu_k.data(), call.cu_seqlens_k, cu_k.size() * sizeof(int32_t), /*async=*/false);
  const int64_t total_q = call.q.seq(), total_k = call.k.seq();
  std::vector<PaddedCall> calls;
  for (int b = 0; b < call.batch; ++b) {
    const int64_t q0 = cu_q[b], k0 = cu_k[b], len_q = int64_t(cu_q[b + 1]) - q0, len_k = int64_t(cu_k[b + 1]) - k0;
    if (q0 < 0 || len_q < 0 || q0 + len_q > total_q || len_q > call.seq_q || k0 < 0 || len_k < 0 ||
        k0 + len_k > total_k || len_k > call.seq_k) {
      throw InvalidArgument(std::string(function) + ": sequence " + std::to_string(b) + " has rows [" +
                            std::to_string(q0) + ", " + std::to_string(q0 + len_q) + ") of q and [" +
                            std::to_string(k0) + ", " + std::to_string(k0 + len_k) +
                            ") of k: expected non-decreasing cu_seqlens within total_q " + std::to_string(total_q) +
                            " / total_k " + std::to_string(total_k) + " and lengths within max_seqlen_q/k");
    }
    if (len_q == 0) continue;
    AttentionCall padded = call;
    padded.cu_seqlens_q = padded.cu_seqlens_k = nullptr;
    padded.batch = 1;
    padded.seq_q = int(len_q);
    padded.seq_k = int(len_k);
    const auto rows_from = [&](TensorView view, int64_t first, int64_t count) {
      view.data = static_cast<unsigned char*>(view.data) + first * view.strides[2] * int64_t(dtype_size(view.dtype));
      view.shape[2] = count;
      return view;
    };
    padded.q = rows_from(call.q, q0, len_q);
    padded.out = rows_from(call.out, q0, len_q);
    padded.k = rows_from(call.k, k0, len_k);
    padded.v = rows_from(call.v, k0, len_k);
    padded.lse = call.lse ? call.lse + q0 : nullptr;
    // Per-sequence bias and slopes: sequence b is batch b of them (rows and keys from 0).
    if (call.bias) {
      padded.bias->data = static_cast<unsigned char*>(call.bias->data) +
                          b * call.bias->strides[0] * int64_t(dtype_size(call.bias->dtype));
      padded.bias->shape[0] = 1;
    }
    if (call.alibi_slopes) padded.alibi_slopes = call.alibi_slopes + b * call.alibi_stride_batch;
    if (call.key_lengths) padded.key_lengths = call.key_lengths + b;  // seqused_k
    if (call.key_start) padded.key_start = call.key_start + b;
    if (call.q_offset) padded.q_offset = call.q_offset + b;
    padded.dropout_batch_base = b;  // the sequence's dropout mask, not batch 0's
    calls.push_back({padded, total_q, b, q0, k0});
  }
  return calls;
}

}  // namespace

kernels::KeyMask key_mask(const AttentionCall& call) {
  return {call.key_lengths, call.key_start,   call.q_offset,    causal_mask_of(call.causal),
          call.seq_q,       call.window_left, call.window_right};
}

kernels::KeyRange chunk_key_span(const AttentionCall& call, const Chunk& chunk) {
  const kernels::CausalMask causal = causal_mask_of(call.causal);
  if (chunk.rows == 0) return {0, 0};
  // Device metadata that moves the rows' keys: only the kernels know them.
  if (call.key_start != nullptr || call.q_offset != nullptr) return {0, call.seq_k};
  if (call.key_lengths != nullptr && causal != kernels::CausalMask::top_left) return {0, call.seq_k};
  // top_left aligns row i with key i whatever the length; a shorter length only lowers `end`.
  const kernels::KeyRange first = kernels::visible_key_range(chunk.row_begin, call.seq_q, call.seq_k, causal,
                                                             call.window_left, call.window_right);
  const kernels::KeyRange last = kernels::visible_key_range(chunk.row_begin + chunk.rows - 1, call.seq_q, call.seq_k,
                                                            causal, call.window_left, call.window_right);
  return {first.begin, last.end};
}

void gemm_over_visible_keys(ContextState& ctx, const GemmBatch& g, const AttentionCall& call, int batch,
                            int row_begin, int key_offset) {
  ctx.device->gemm_strided_batched(g);
  const int64_t elements = int64_t(g.m) * g.n * g.batch_count;
  // Keys past a length or before a key_start may hold anything (NaN): the GEMM's sums over them
  // are redone over the keys each row sees.
  if ((call.key_lengths == nullptr && call.key_start == nullptr) || elements == 0) return;
  if (g.beta != 0.0f) throw BackendError("gemm_over_visible_keys: needs beta == 0");
  const kernels::KernelRef repair = SELFATTN_KERNEL_FOR(ctx.device->backend(), gemm_key_repair_kernel_ref());
  if (!repair) throw NotAvailable("attention: no gemm_key_repair kernel for this backend");
  const kernels::GemmKeyRepairParams params{g.a, g.b, g.c, element_of(g.a_type), element_of(g.c_type), g.trans_a,
                                            g.trans_b, g.m, g.n, g.k, g.batch_count, g.lda, g.ldb, g.ldc,
                                            g.stride_a, g.stride_b, g.stride_c, g.alpha,
                                            call.key_lengths ? call.key_lengths + batch : nullptr,
                                            call.key_start ? call.key_start + batch : nullptr,
                                            call.q_offset ? call.q_offset + batch : nullptr, key_offset, row_begin,
                                            call.seq_q, call.seq_k, causal_mask_of(call.causal), call.window_left,
                                            call.window_right};
  constexpr int kThreads = 256;
  constexpr int64_t kMaxBlocks = 65535;  // the grid-stride loop covers the rest
  kernels::LaunchShape shape;
  shape.grid = dim3(unsigned(std::min((elements + kThreads - 1) / kThreads, kMaxBlocks)));
  shape.block = dim3(kThreads);
  ctx.device->launch(repair, shape, &params);
}

void launch_qk(ContextState& ctx, const kernels::TiledKernel& kernel, const AttentionCall& call, const Chunk& chunk,
               const TensorView& a, const TensorView& b, float* out, int64_t row_stride) {
  kernels::QkParams qk{};
  qk.q = heads_view(a);
  qk.k = heads_view(b);
  qk.s = out;
  qk.s_bh_stride = row_stride * chunk.rows;
  qk.s_row_stride = row_stride;
  qk.heads = call.heads;
  qk.heads_per_kv = call.heads / call.kv_heads;
  qk.bh_begin = chunk.pair_begin;
  qk.row_begin = chunk.row_begin;
  qk.rows = chunk.rows;
  qk.seq_k = call.seq_k;
  qk.head_dim = int(a.head_dim());  // the rows' length: d_qk for Q K^T, d_v for the backward's dO V^T
  qk.mask = key_mask(call);
  kernels::LaunchShape shape;
  shape.grid = dim3(tile_count(call.seq_k, kernel.tile_cols), tile_count(chunk.rows, kernel.tile_rows), unsigned(chunk.pairs));
  shape.block = dim3(unsigned(kernel.threads));
  shape.dynamic_smem_bytes = kernel.smem_bytes;
  if (call.seq_k > 0) ctx.device->launch(kernel.kernel, shape, &qk);  // none: nothing to compute
}

void zero_chunk_rows(Device& device, const TensorView& view, int heads, const Chunk& chunk) {
  const size_t row_bytes = size_t(view.head_dim()) * dtype_size(view.dtype);
  for (int pair = chunk.pair_begin; pair < chunk.pair_begin + chunk.pairs; ++pair)
    for (int row = chunk.row_begin; row < chunk.row_begin + chunk.rows; ++row)
      device.fill(static_cast<unsigned char*>(view.data) +
                      view.offset(pair / heads, pair % heads, row, 0) * int64_t(dtype_size(view.dtype)),
                  0, row_bytes);
}

ScorePlan plan_scores(ContextState& ctx, const AttentionCall& call, ScoreLayout (*layout_of)(const AttentionCall&),
                      size_t reserved_before, const char* function) {
  const size_t limit = ctx.workspace.limit();
  const size_t budget = limit > reserved_before ? limit - reserved_before : 0;
  ScorePlan plan;
  for (const PaddedCall& padded : padded_calls(ctx, call, function)) {
    ChunkedCall chunked{padded.call, padded.lse_pair_stride, layout_of(padded.call), 0, 0, padded.q_row_offset,
                        padded.k_row_offset, std::max(padded.sequence, 0)};
    chunked.layout.row_bytes = std::max<size_t>(chunked.layout.row_bytes, 16);
    const size_t row_bytes = chunked.layout.row_bytes;
    if (row_bytes > budget) {
      const std::string which = padded.sequence < 0 ? "" : " of sequence " + std::to_string(padded.sequence);
      const std::string besides =
          reserved_before == 0 ? "" : " besides " + std::to_string(reserved_before) + " bytes reserved before them";
      throw WorkspaceTooSmall(std::string(function) + ": one query row" + which + " (" +
                              std::to_string(padded.call.seq_k) + " keys) needs " + std::to_string(row_bytes) +
                              " bytes of scores" + besides + ", but the workspace limit is " +
                              std::to_string(limit) +
                              " bytes; raise ContextOptions::workspace_limit or Context::set_workspace_limit");
    }
    const ChunkShape shape = shape_for_budget(padded.call, row_bytes, budget);
    chunked.pairs = shape.pairs;
    chunked.rows = shape.rows;
    plan.workspace_bytes = std::max(plan.workspace_bytes, size_t(shape.pairs) * shape.rows * row_bytes);
    plan.calls.push_back(chunked);
  }
  return plan;
}

void for_each_chunk(const ChunkedCall& chunked, const std::function<void(const Chunk&)>& run_chunk) {
  const AttentionCall& call = chunked.call;
  const int pairs_total = call.batch * call.heads;
  for (int pair = 0; pair < pairs_total; pair += chunked.pairs) {
    for (int row = 0; row < call.seq_q; row += chunked.rows) {
      Chunk chunk;
      chunk.pair_begin = pair;
      chunk.pairs = std::min(chunked.pairs, pairs_total - pair);
      chunk.row_begin = row;
      chunk.rows = std::min(chunked.rows, call.seq_q - row);
      run_chunk(chunk);
    }
  }
}

void launch_softmax(ContextState& ctx, const AttentionCall& call, const Chunk& chunk, const float* s,
                    int64_t s_row_stride, void* p, kernels::Element p_elem, int64_t p_row_stride, float scale,
                    int64_t lse_pair_stride, int64_t p_pair_stride, bool dropout_signs) {
  const kernels::SoftmaxKernel softmax = SELFATTN_KERNEL_FOR(ctx.device->backend(), softmax_rows_instance(p_elem, call.seq_k));
  if (!softmax.kernel) throw NotAvailable("attention: no softmax_rows kernel for this backend");

  kernels::SoftmaxParams params{};
  params.s = s;
  params.p = p;
  params.s_row_stride = s_row_stride;
  params.s_bh_stride = s_row_stride * chunk.rows;
  params.p_row_stride = p_row_stride;
  params.p_bh_stride = p_pair_stride >= 0 ? p_pair_stride : p_row_stride * chunk.rows;
  params.lse = call.lse;
  params.lse_pair_stride = lse_pair_stride;
  params.mask = key_mask(call);
  params.mods = score_mods_of(call);
  params.scale = scale;
  params.heads = call.heads;
  params.bh_begin = chunk.pair_begin;
  params.row_begin = chunk.row_begin;
  params.rows = chunk.rows;
  params.seq_k = call.seq_k;
  params.dropout_signs = dropout_signs;

  kernels::LaunchShape shape;
  shape.grid = dim3(unsigned((chunk.rows + softmax.rows_per_block - 1) / softmax.rows_per_block), unsigned(chunk.pairs));
  shape.block = dim3(unsigned(softmax.threads));
  shape.dynamic_smem_bytes = softmax.smem_bytes;
  ctx.device->launch(softmax.kernel, shape, &params);
}

}  // namespace selfattn::detail
