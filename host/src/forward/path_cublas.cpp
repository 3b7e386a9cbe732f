// Path 'cublas': per chunk (score_chunks.h), two strided-batched GEMMs (Device::gemm_strided_batched:
// cuBLAS on a GPU, gemm_sim.cpp on the sim) with our softmax kernel between them.
//
// Row-major [rows x cols] with row stride ld is, to column-major cuBLAS, the [cols x rows] matrix
// with leading dimension ld - its transpose. So, with every matrix seen that way:
//   S^T [seq_k x rows] = scale * K [seq_k x d] . Q^T [d x rows]     A = K (stored K^T: trans_a), B = Q^T
//   O^T [d x rows]     = V^T [d x seq_k] . P^T [seq_k x rows]        A = V^T, B = P^T, both as stored
// The scale is folded into alpha of the first GEMM (the softmax then runs with scale 1).
// cuBLAS takes A and B of one type, so for f16/bf16 the softmax writes P in the input dtype to its
// own workspace region; for f32 it writes P over S.
//
// Variable-length batches run sequence by sequence (the plan's padded calls, score_chunks.h).
//
// One GEMM covers a run of (batch, head) pairs whose Q, K, V, S and O addresses all advance by a
// constant stride: all pairs of a BHSD call without GQA; the heads of one batch in BSHD; the query
// heads sharing one kv head under GQA (K and V stride 0 - nothing is copied).
//
// Keys no row sees may hold anything, NaN included (a KV cache's unused rows, a sliding window's
// dropped keys), and P = 0 there does not help a GEMM (0 * NaN = NaN). So both GEMMs of a chunk run
// over the keys its rows may see (chunk_key_span, known on the host: causal mask and window), and
// with key lengths the P V GEMM runs per batch, each row's sum bounded on the device by the keys it
// sees under that batch's length (gemm_over_visible_keys: past the length, and before a window
// aligned at the last key). Inside those bounds, Q K^T's NaN scores of keys a particular row
// does not see go nowhere: the softmax only reads the scores of visible keys (selection, not
// arithmetic).
#include <algorithm>
#include <climits>
#include <cstdint>

#include "forward/paths.h"
#include "forward/score_chunks.h"
#include "selfattn/error.h"

namespace selfattn::detail {
namespace {

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// Element offsets of one (batch, head) pair's first row in each tensor.
struct PairOffsets {
  int64_t q, k, v, out;
};
PairOffsets offsets_of(const AttentionCall& call, int pair) {
  const int batch = pair / call.heads, head = pair % call.heads;
  const int kv_head = head / (call.heads / call.kv_heads);
  return {batch * call.q.strides[0] + head * call.q.strides[1], batch * call.k.strides[0] + kv_head * call.k.strides[1],
          batch * call.v.strides[0] + kv_head * call.v.strides[1], batch * call.out.strides[0] + head * call.out.strides[1]};
}

const void* at(const void* base, DType type, int64_t elements) {
  return static_cast<const unsigned char*>(base) + elements * int64_t(dtype_size(type));
}

// The longest run of pairs from `first` (at most `count`) whose offsets advance by one stride each.
struct PairRun {
  int pairs = 1;
  PairOffsets stride{0, 0, 0, 0};
};
PairRun run_from(const AttentionCall& call, int first, int count) {
  PairRun run;
  if (count < 2) return run;
  const PairOffsets a = offsets_of(call, first), b = offsets_of(call, first + 1);
  run.stride = {b.q - a.q, b.k - a.k, b.v - a.v, b.out - a.out};
  PairOffsets previous = b;
  for (run.pairs = 2; run.pairs < count; ++run.pairs) {
    const PairOffsets next = offsets_of(call, first + run.pairs);
    if (next.q - previous.q != run.stride.q || next.k - previous.k != run.stride.k ||
        next.v - previous.v != run.stride.v || next.out - previous.out != run.stride.out)
      break;
    previous = next;
  }
  return run;
}

bool fits_int(int64_t value) { return value >= 0 && value <= INT_MAX; }

}  // namespace

const char* cublas_unsupported(const ContextState&, const AttentionCall& call) {
  // The sequence stride is cuBLAS's leading dimension: an int, at least the rows it spans (its head dim).
  for (const TensorView* view : {&call.q, &call.k, &call.v, &call.out}) {
    if (!fits_int(view->strides[2])) return "a sequence stride does not fit cuBLAS's int leading dimension";
    if (view->strides[2] < view->head_dim()) return "a sequence stride below head_dim (overlapping rows) is no cuBLAS leading dimension";
  }
  return nullptr;
}

ScoreLayout cublas_score_layout(const AttentionCall& padded) {
  // S fp32 with 16-byte aligned rows; for f16/bf16 P follows in its own region (16-byte aligned rows).
  ScoreLayout layout;
  const bool p_over_s = padded.dtype == DType::f32;
  layout.s_row_stride = round_up(padded.seq_k, 4);
  layout.p_row_stride = p_over_s ? layout.s_row_stride : round_up(padded.seq_k, 8);
  layout.row_bytes = size_t(layout.s_row_stride) * sizeof(float) +
                     (p_over_s ? 0 : size_t(layout.p_row_stride) * dtype_size(padded.dtype));
  return layout;
}

namespace {

void run_padded(ContextState& ctx, const ChunkedCall& chunked, void* workspace) {
  const AttentionCall& call = chunked.call;
  const bool p_over_s = call.dtype == DType::f32;
  const kernels::Element p_elem = element_of(call.dtype);
  const int64_t s_ld = chunked.layout.s_row_stride, p_ld = chunked.layout.p_row_stride;

  for_each_chunk(chunked, [&](const Chunk& chunk) {
    float* scores = static_cast<float*>(workspace);
    const int64_t s_pair_stride = s_ld * chunk.rows;
    void* probs = p_over_s ? workspace : static_cast<void*>(scores + s_pair_stride * chunk.pairs);
    const int64_t p_pair_stride = p_ld * chunk.rows;
    const DType p_type = call.dtype;

    const kernels::KeyRange span = chunk_key_span(call, chunk);
    const int span_keys = span.end > span.begin ? span.end - span.begin : 0;
    for (int done = 0; done < chunk.pairs && span_keys > 0;) {
      const int pair = chunk.pair_begin + done;
      const PairRun run = run_from(call, pair, chunk.pairs - done);
      const PairOffsets first = offsets_of(call, pair);
      const int64_t q_row0 = first.q + int64_t(chunk.row_begin) * call.q.strides[2];

      // S's columns span.begin .. span.end - 1 (the others are never read).
      GemmBatch qk;
      qk.trans_a = true;
      qk.trans_b = false;
      qk.m = span_keys;
      qk.n = chunk.rows;
      qk.k = call.head_dim_qk;
      qk.alpha = call.scale;
      qk.beta = 0;
      qk.a = at(call.k.data, call.dtype, first.k + span.begin * call.k.strides[2]);
      qk.a_type = call.dtype;
      qk.lda = call.k.strides[2];
      qk.stride_a = run.stride.k;
      qk.b = at(call.q.data, call.dtype, q_row0);
      qk.b_type = call.dtype;
      qk.ldb = call.q.strides[2];
      qk.stride_b = run.stride.q;
      qk.c = scores + s_pair_stride * done + span.begin;
      qk.c_type = DType::f32;
      qk.ldc = s_ld;
      qk.stride_c = s_pair_stride;
      qk.batch_count = run.pairs;
      ctx.device->gemm_strided_batched(qk);
      done += run.pairs;
    }

    launch_softmax(ctx, call, chunk, scores, s_ld, probs, p_elem, p_ld, /*scale=*/1.0f, chunked.lse_pair_stride);

    if (span_keys == 0) zero_chunk_rows(*ctx.device, call.out, call.heads, chunk);  // no row of it sees a key
    for (int done = 0; done < chunk.pairs && span_keys > 0;) {
      const int pair = chunk.pair_begin + done;
      // With per-batch keys (lengths, starts, offsets), one GEMM per batch at most: its sums stop at
      // the keys each row sees under that batch's metadata (gemm_over_visible_keys).
      const int batch = pair / call.heads, count = chunk.pairs - done;
      const int left_in_batch = (batch + 1) * call.heads - pair;
      const PairRun run = run_from(call, pair, call.per_batch_keys() ? std::min(count, left_in_batch) : count);
      const PairOffsets first = offsets_of(call, pair);
      const int64_t out_row0 = first.out + int64_t(chunk.row_begin) * call.out.strides[2];

      GemmBatch pv;
      pv.trans_a = false;
      pv.trans_b = false;
      pv.m = call.head_dim_v;
      pv.n = chunk.rows;
      pv.k = span_keys;
      pv.alpha = 1;
      pv.beta = 0;
      pv.a = at(call.v.data, call.dtype, first.v + span.begin * call.v.strides[2]);
      pv.a_type = call.dtype;
      pv.lda = call.v.strides[2];
      pv.stride_a = run.stride.v;
      pv.b = at(probs, p_type, p_pair_stride * done + span.begin);
      pv.b_type = p_type;
      pv.ldb = p_ld;
      pv.stride_b = p_pair_stride;
      pv.c = const_cast<void*>(at(call.out.data, call.dtype, out_row0));
      pv.c_type = call.dtype;
      pv.ldc = call.out.strides[2];
      pv.stride_c = run.stride.out;
      pv.batch_count = run.pairs;
      gemm_over_visible_keys(ctx, pv, call, batch, chunk.row_begin, span.begin);
      done += run.pairs;
    }
  });
}
}  // namespace

void run_cublas(ContextState& ctx, const ScorePlan& plan, void* workspace) {
  for (const ChunkedCall& chunked : plan.calls) run_padded(ctx, chunked, workspace);
}

}  // namespace selfattn::detail
