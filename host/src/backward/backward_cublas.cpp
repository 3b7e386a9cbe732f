// Path 'cublas' of attention_backward(): the naive backward's plan (backward_score_paths.h) with
// strided-batched GEMMs (Device::gemm_strided_batched: cuBLAS on a GPU, gemm_sim.cpp on the sim)
// for the five matrix products, and the shared backward_scores kernel between them.
//
// As in path_cublas.cpp, a row-major [rows x cols] matrix with row stride ld is, to column-major
// cuBLAS, its transpose with leading dimension ld. Per chunk, with every matrix seen that way:
//   S^T  [seq_k x rows] = K . Q^T          A = K (stored K^T: trans_a), B = Q^T as stored
//   dP^T [seq_k x rows] = V . dO^T         the same on V and dO
//   P, dS                                  backward_scores (dS carries the scale and softcap factor)
//   dQ^T [d_qk x rows]  = K^T . dS^T       A = K^T, B = dS^T, both as stored; C = dq, beta 0
//   dV^T [d_v x seq_k] += dO^T . P         A = dO^T as stored, B = P (stored P^T: trans_b); beta 1
//   dK^T [d_qk x seq_k] += Q^T . dS        the same on Q and dS
// (S over d_qk = head_dim_qk, dP over d_v = head_dim_v.)
// dK and dV accumulate in fp32 (in dk's and dv's shapes, C of f32 with A/B in the input dtype)
// across chunks and across the GQA group's heads, one GEMM after another on one stream: the order of
// the sums is fixed, so the gradients are bitwise deterministic. store_gradient writes dk and dv.
// cuBLAS takes A and B of one type: for f16/bf16 the scores kernel writes P and dS in that dtype to
// their own region (rounded, as the tensor-core naive kernels do); for f32 over S and dP.
//
// One GEMM covers a run of (batch, head) pairs whose operand addresses all advance by one stride.
// The dK/dV GEMMs must not give two problems of one GEMM the same C, so under GQA they run once per
// head position g within the group: the pairs g, g + heads_per_kv, ... each of another kv head.
//
// Keys no row sees: K and V rows past a batch's length, or outside every row's window, may hold
// anything, NaN included (a KV cache's unused rows). As in path_cublas.cpp, every GEMM of a chunk
// runs over the keys its rows may see (chunk_key_span): dK and dV rows outside get nothing added
// (their accumulators start at 0, as on the other paths). Inside, S and dP get NaN past a key
// length, but backward_scores reads only visible keys (selection), so P = dS = 0 there; dV += dO^T P
// and dK += Q^T dS then add exact zeros to those rows (dO and Q, query rows, have no padding). Only
// dQ = dS K sums over keys, where 0 * NaN = NaN: as the forward's P V, it runs per batch with each
// row's sum bounded by the keys it sees under that batch's length (gemm_over_visible_keys).
#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/backward/naive_backward_params.h"
#include "runtime/backend_kernels.h"
#include "backward/backward_paths.h"
#include "backward/backward_score_paths.h"
#include "forward/kernel_args.h"
#include "forward/score_chunks.h"
#include "selfattn/error.h"

namespace selfattn::detail {
namespace {

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }
bool fits_int(int64_t value) { return value >= 0 && value <= INT_MAX; }

ScoreLayout cublas_backward_layout(const AttentionCall& padded) {
  // S and dP fp32 (16-byte aligned rows); for f16/bf16 P and dS follow in that dtype (16-byte rows).
  ScoreLayout layout;
  const bool over = padded.dtype == DType::f32;
  layout.s_row_stride = round_up(padded.seq_k, 4);
  layout.p_row_stride = over ? layout.s_row_stride : round_up(padded.seq_k, 8);
  layout.row_bytes = 2 * size_t(layout.s_row_stride) * sizeof(float) +
                     (over ? 0 : 2 * size_t(layout.p_row_stride) * dtype_size(padded.dtype));
  return layout;
}

kernels::BackwardKernel scores_kernel(Backend backend, kernels::Element p_elem) {
  return SELFATTN_KERNEL_FOR(backend, backward_scores_instance(p_elem));
}

// Element offsets of one (batch, head) pair's first row in each operand, and its kv pair (the
// accumulators' index: their element offsets depend on the accumulator's row length).
struct PairOffsets {
  int64_t q, k, v, dout, dq, kv_pair;
};
PairOffsets offsets_of(const AttentionCall& call, const BackwardSlices& slices, int pair) {
  const int batch = pair / call.heads, head = pair % call.heads;
  const int heads_per_kv = call.heads / call.kv_heads;
  const int kv_head = head / heads_per_kv;
  return {batch * call.q.strides[0] + head * call.q.strides[1],
          batch * call.k.strides[0] + kv_head * call.k.strides[1],
          batch * call.v.strides[0] + kv_head * call.v.strides[1],
          batch * slices.dout.strides[0] + head * slices.dout.strides[1],
          batch * slices.dq.strides[0] + head * slices.dq.strides[1], int64_t(pair / heads_per_kv)};
}
PairOffsets minus(const PairOffsets& a, const PairOffsets& b) {
  return {a.q - b.q, a.k - b.k, a.v - b.v, a.dout - b.dout, a.dq - b.dq, a.kv_pair - b.kv_pair};
}
bool same(const PairOffsets& a, const PairOffsets& b) {
  return a.q == b.q && a.k == b.k && a.v == b.v && a.dout == b.dout && a.dq == b.dq && a.kv_pair == b.kv_pair;
}

// The longest run of pairs first, first + step, ... (at most `count` of them) whose offsets all
// advance by one stride each.
struct PairRun {
  int pairs = 1;
  PairOffsets stride{0, 0, 0, 0, 0, 0};
};
PairRun run_from(const AttentionCall& call, const BackwardSlices& slices, int first, int count, int step) {
  PairRun run;
  if (count < 2) return run;
  PairOffsets previous = offsets_of(call, slices, first + step);
  run.stride = minus(previous, offsets_of(call, slices, first));
  for (run.pairs = 2; run.pairs < count; ++run.pairs) {
    const PairOffsets next = offsets_of(call, slices, first + run.pairs * step);
    if (!same(minus(next, previous), run.stride)) break;
    previous = next;
  }
  return run;
}

const void* at(const void* base, DType type, int64_t elements) {
  return static_cast<const unsigned char*>(base) + elements * int64_t(dtype_size(type));
}

// The chunk's score regions: S, dP (fp32), then P, dS (P's type; over S and dP for f32).
struct ChunkScores {
  float* s;
  float* dp;
  void* p;
  void* ds;
  int64_t s_pair_stride, p_pair_stride;  // elements of each region's type
};
ChunkScores chunk_scores(const ChunkedCall& chunked, const Chunk& chunk, void* base) {
  ChunkScores c;
  const int64_t s_elements = chunked.layout.s_row_stride * chunk.rows * chunk.pairs;
  c.s_pair_stride = chunked.layout.s_row_stride * chunk.rows;
  c.p_pair_stride = chunked.layout.p_row_stride * chunk.rows;
  c.s = static_cast<float*>(base);
  c.dp = c.s + s_elements;
  if (chunked.call.dtype == DType::f32) {
    c.p = c.s;
    c.ds = c.dp;
  } else {
    c.p = c.dp + s_elements;
    c.ds = static_cast<unsigned char*>(c.p) +
           size_t(chunked.layout.p_row_stride * chunk.rows * chunk.pairs) * dtype_size(chunked.call.dtype);
  }
  return c;
}

void run_padded(ContextState& ctx, const kernels::BackwardKernel& scores_k, const PlannedBackward& planned,
                const ChunkedCall& chunked, void* workspace) {
  const AttentionCall& call = chunked.call;
  const BackwardSlices slices = slices_of(planned, chunked, workspace);
  const DType t = call.dtype;
  const int64_t s_ld = chunked.layout.s_row_stride, p_ld = chunked.layout.p_row_stride;
  void* base = static_cast<unsigned char*>(workspace) + planned.workspace.scores_offset;
  const int heads_per_kv = call.heads / call.kv_heads;

  for_each_chunk(chunked, [&](const Chunk& chunk) {
    const ChunkScores sc = chunk_scores(chunked, chunk, base);
    const kernels::KeyRange span = chunk_key_span(call, chunk);
    const int span_keys = span.end > span.begin ? span.end - span.begin : 0;

    // S^T = K . Q^T and dP^T = V . dO^T, then dQ^T = K^T . dS^T below: runs of consecutive pairs.
    const auto scores_gemm = [&](bool for_dp) {
      for (int done = 0; done < chunk.pairs && span_keys > 0;) {
        const int pair = chunk.pair_begin + done;
        const PairRun run = run_from(call, slices, pair, chunk.pairs - done, 1);
        const PairOffsets first = offsets_of(call, slices, pair);
        const TensorView& a = for_dp ? call.v : call.k;
        const TensorView& b = for_dp ? slices.dout : call.q;
        GemmBatch g;
        g.trans_a = true;
        g.trans_b = false;
        g.m = span_keys;  // S's and dP's columns span.begin .. span.end - 1 (the others are never read)
        g.n = chunk.rows;
        g.k = int(a.head_dim());  // d_qk for S, d_v for dP
        g.alpha = 1;  // backward_scores applies the scale (it needs the scaled score for the modifiers)
        g.beta = 0;
        g.a = at(a.data, t, (for_dp ? first.v : first.k) + span.begin * a.strides[2]);
        g.a_type = t;
        g.lda = a.strides[2];
        g.stride_a = for_dp ? run.stride.v : run.stride.k;
        g.b = at(b.data, t, (for_dp ? first.dout : first.q) + int64_t(chunk.row_begin) * b.strides[2]);
        g.b_type = t;
        g.ldb = b.strides[2];
        g.stride_b = for_dp ? run.stride.dout : run.stride.q;
        g.c = (for_dp ? sc.dp : sc.s) + sc.s_pair_stride * done + span.begin;
        g.c_type = DType::f32;
        g.ldc = s_ld;
        g.stride_c = sc.s_pair_stride;
        g.batch_count = run.pairs;
        ctx.device->gemm_strided_batched(g);
        done += run.pairs;
      }
    };
    scores_gemm(false);
    scores_gemm(true);

    kernels::BackwardScoresParams sp{};
    sp.s = sc.s;
    sp.dp = sc.dp;
    sp.p = sc.p;
    sp.ds = sc.ds;
    sp.s_bh_stride = sc.s_pair_stride;
    sp.s_row_stride = s_ld;
    sp.p_bh_stride = sc.p_pair_stride;
    sp.p_row_stride = p_ld;
    sp.lse = slices.lse;
    sp.d = slices.d;
    sp.lse_pair_stride = chunked.lse_pair_stride;
    sp.mask = key_mask(call);
    sp.mods = score_mods_of(call);
    sp.scale = call.scale;
    sp.heads = call.heads;
    sp.bh_begin = chunk.pair_begin;
    sp.row_begin = chunk.row_begin;
    sp.rows = chunk.rows;
    sp.seq_k = call.seq_k;
    kernels::LaunchShape shape;
    shape.grid = dim3(unsigned((chunk.rows + scores_k.rows_per_block - 1) / scores_k.rows_per_block),
                      unsigned(chunk.pairs));
    shape.block = dim3(unsigned(scores_k.threads));
    ctx.device->launch(scores_k.kernel, shape, &sp);

    if (span_keys == 0) zero_chunk_rows(*ctx.device, slices.dq, call.heads, chunk);  // no row sees a key: dq = 0
    for (int done = 0; done < chunk.pairs && span_keys > 0;) {
      const int pair = chunk.pair_begin + done;
      // With per-batch keys (lengths, starts, offsets), one GEMM per batch at most: its sums stop at
      // the keys each row sees under that batch's metadata (gemm_over_visible_keys).
      const int batch = pair / call.heads, count = chunk.pairs - done;
      const int left_in_batch = (batch + 1) * call.heads - pair;
      const PairRun run =
          run_from(call, slices, pair, call.per_batch_keys() ? std::min(count, left_in_batch) : count, 1);
      const PairOffsets first = offsets_of(call, slices, pair);
      GemmBatch g;
      g.trans_a = false;
      g.trans_b = false;
      g.m = call.head_dim_qk;
      g.n = chunk.rows;
      g.k = span_keys;
      g.alpha = 1;  // the scale is in dS
      g.beta = 0;
      g.a = at(call.k.data, t, first.k + span.begin * call.k.strides[2]);
      g.a_type = t;
      g.lda = call.k.strides[2];
      g.stride_a = run.stride.k;
      g.b = at(sc.ds, t, sc.p_pair_stride * done + span.begin);
      g.b_type = t;
      g.ldb = p_ld;
      g.stride_b = sc.p_pair_stride;
      g.c = const_cast<void*>(at(slices.dq.data, slices.dq.dtype, first.dq + int64_t(chunk.row_begin) * slices.dq.strides[2]));
      g.c_type = slices.dq.dtype;
      g.ldc = slices.dq.strides[2];
      g.stride_c = run.stride.dq;
      g.batch_count = run.pairs;
      gemm_over_visible_keys(ctx, g, call, batch, chunk.row_begin, span.begin);
      done += run.pairs;
    }

    // dV^T += dO^T . P and dK^T += Q^T . dS, once per head position g within the GQA group, so the
    // problems of one GEMM write different kv heads.
    const auto kv_gemm = [&](bool for_dk) {
      for (int g_pos = 0; g_pos < heads_per_kv; ++g_pos) {
        // The chunk's pairs at head position g_pos: pair % heads_per_kv == g_pos (heads is a multiple).
        const int offset = ((g_pos - chunk.pair_begin % heads_per_kv) % heads_per_kv + heads_per_kv) % heads_per_kv;
        const int count = offset < chunk.pairs ? (chunk.pairs - offset + heads_per_kv - 1) / heads_per_kv : 0;
        for (int done = 0; done < count && span_keys > 0;) {
          const int index = offset + done * heads_per_kv;  // within the chunk
          const int pair = chunk.pair_begin + index;
          const PairRun run = run_from(call, slices, pair, count - done, heads_per_kv);
          const PairOffsets first = offsets_of(call, slices, pair);
          const TensorView& a = for_dk ? call.q : slices.dout;
          GemmBatch g;
          g.trans_a = false;
          g.trans_b = true;
          g.m = int(a.head_dim());  // dK's columns (d_qk) or dV's (d_v)
          g.n = span_keys;  // dK's and dV's rows span.begin .. span.end - 1
          g.k = chunk.rows;
          g.alpha = 1;
          g.beta = 1;
          g.a = at(a.data, t, (for_dk ? first.q : first.dout) + int64_t(chunk.row_begin) * a.strides[2]);
          g.a_type = t;
          g.lda = a.strides[2];
          g.stride_a = for_dk ? run.stride.q : run.stride.dout;
          g.b = at(for_dk ? sc.ds : sc.p, t, sc.p_pair_stride * index + span.begin);
          g.b_type = t;
          g.ldb = p_ld;
          g.stride_b = sc.p_pair_stride * heads_per_kv;
          const KvAccumulator& acc = for_dk ? slices.dk_accum : slices.dv_accum;
          g.c = acc.first + first.kv_pair * acc.kv_stride + int64_t(span.begin) * acc.row_length;
          g.c_type = DType::f32;
          g.ldc = acc.row_length;
          g.stride_c = run.stride.kv_pair * acc.kv_stride;
          g.batch_count = run.pairs;
          ctx.device->gemm_strided_batched(g);
          done += run.pairs;
        }
      }
    };
    kv_gemm(false);
    kv_gemm(true);
  });
}

}  // namespace

const char* cublas_backward_unsupported(const ContextState& ctx, const BackwardCall& call) {
  if (const char* reason = cublas_unsupported(ctx, call.forward)) return reason;
  // dout is a GEMM operand and dq a GEMM result: the same leading-dimension rule as q.
  for (const TensorView* view : {&call.dout, &call.dq}) {
    if (!fits_int(view->strides[2])) return "a sequence stride does not fit cuBLAS's int leading dimension";
    if (view->strides[2] < view->head_dim())
      return "a sequence stride below head_dim (overlapping rows) is no cuBLAS leading dimension";
  }
  if (!scores_kernel(ctx.device->backend(), element_of(call.forward.dtype)).kernel)
    return "the backward_scores kernel is not built for this backend";
  return nullptr;
}

void plan_cublas_backward(ContextState& ctx, PlannedBackward& planned, const char* function) {
  plan_score_backward(ctx, planned, function, cublas_backward_layout);
}

void run_cublas_backward(ContextState& ctx, const PlannedBackward& planned, void* workspace) {
  const kernels::BackwardKernel scores_k = scores_kernel(ctx.device->backend(), element_of(planned.call.forward.dtype));
  if (!scores_k.kernel) throw NotAvailable("attention_backward: backward_scores kernel not built for this backend");
  zero_kv_accumulators(ctx, planned, workspace);
  for (const ChunkedCall& chunked : planned.scores.calls) {
    if (chunked.call.seq_k == 0) continue;  // a varlen sequence without keys: its dq rows are already 0
    run_padded(ctx, scores_k, planned, chunked, workspace);
  }
  store_kv_gradients(ctx, planned, workspace);
}

}  // namespace selfattn::detail
