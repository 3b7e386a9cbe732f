#pragma once
// CPU reference in double precision, with exactly the semantics of attention() (every option).
// Host memory; inputs given as double, row-major with the same [batch, heads, seq, head_dim] shape
// convention (contiguous BHSD). Used by the tests and by the benchmark's --check.
#include <cstdint>
#include <vector>

#include "selfattn/types.h"

namespace selfattn::reference {

struct Problem {
  int batch = 1, heads = 1, kv_heads = 1, seq_q = 1, seq_k = 1, head_dim = 1;
  // v's and out's head dim where it differs from q's and k's (head_dim); 0: head_dim.
  int head_dim_v = 0;
  Causal causal = Causal::none;
  double scale = 0;                  // 0: 1/sqrt(head_dim)
  int v_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  std::vector<int32_t> key_lengths;  // empty, or [batch]
  std::vector<int32_t> key_start;    // empty, or [batch] (AttentionOptions::key_start)
  std::vector<int32_t> q_offset;     // empty, or [batch] (AttentionOptions::q_offset)
  // Masks and score modifiers, as AttentionOptions (attention.h) defines them.
  int window_left = -1, window_right = -1;  // -1: unbounded
  double softcap = 0;                       // 0: none
  std::vector<double> alibi_slopes;         // empty, [heads] or [batch, heads]
  std::vector<double> bias;                 // empty, or dense [batch, heads, seq_q, seq_k]; -inf masks
  std::vector<double> sinks;                // empty, or [heads]: attention sinks' logits (-inf: none)
  // Dropout (AttentionOptions::dropout_p), taken as an input so tests compare exactly: empty, or
  // the keep flags [batch, heads, seq_q, seq_k] (nonzero: kept; dropout_keep_mask() gives the
  // library's), the kept probabilities scaled by 1 / (1 - dropout_p), the others 0.
  double dropout_p = 0;
  std::vector<uint8_t> dropout_keep;
};

// The keep flags attention() draws for AttentionOptions::dropout_p, dropout_seed and dropout_offset
// over a call of [batch, heads, seq_q, seq_k] (kernels/common/dropout.cuh's rule, the same Philox
// function): 1 kept, 0 dropped, [batch, heads, seq_q, seq_k]. first_batch is the batch (varlen:
// the sequence) the call's batch 0 stands for: a varlen call's sequence b alone is
// dropout_keep_mask(..., 1, heads, len_q, len_k, b). All ones when dropout_p is 0.
std::vector<uint8_t> dropout_keep_mask(double dropout_p, uint64_t seed, uint64_t offset, int batch, int heads,
                                       int seq_q, int seq_k, int first_batch = 0);

struct Result {
  std::vector<double> out;  // [batch, heads, seq_q, v_dim()]
  std::vector<double> lse;  // [batch, heads, seq_q]
};

// q: [batch, heads, seq_q, head_dim]; k: [batch, kv_heads, seq_k, head_dim]; v: [batch, kv_heads,
// seq_k, v_dim()] (contiguous).
Result attention(const Problem& problem, const std::vector<double>& q, const std::vector<double>& k,
                 const std::vector<double>& v);

// The softmax weights attention() gives each key, [batch, heads, seq_q, seq_k]: exp(s_ij - lse_i)
// over the keys row i sees (the masks, modifiers and sink as attention() applies them), 0 for the
// others; before dropout (selfattn::attention_probabilities writes these, with dropout's signs).
std::vector<double> attention_probabilities(const Problem& problem, const std::vector<double>& q,
                                            const std::vector<double>& k);

// The gradients of attention() (selfattn/backward.h) in double precision: dq like q, dk and dv like
// k, dv like v, for the upstream gradient dout [batch, heads, seq_q, v_dim()]. Computed from q, k, v and dout
// alone (the forward is redone exactly). Rows that see no key get dq = 0; keys no row sees get
// dk = dv = 0. dlse, when not empty, is the upstream gradient of the LSE ([batch, heads, seq_q]):
// the loss is then sum(dout * out) + sum(dlse * lse). Implemented in reference_backward.cpp.
// With sinks, dsinks [heads] is the gradient of each head's sink logit (summed over the batch and
// rows); it is empty without sinks.
struct Gradients {
  std::vector<double> dq, dk, dv, dsinks;
};
Gradients attention_backward(const Problem& problem, const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, const std::vector<double>& dout,
                             const std::vector<double>& dlse = {});

// Number of keys (a prefix [0, n)) that query `row` sees under the causal mask alone.
int visible_keys(int row, int seq_q, int len_k, Causal causal);

// The key position row `row` is aligned with: row under top_left, row + (len_k - seq_q) under
// bottom_right and none (types.h). Sliding windows and ALiBi distances are measured from it.
int aligned_row(int row, int seq_q, int len_k, Causal causal);

// The ALiBi slope of (batch, head): 0 without slopes, else slopes[head] ([heads]) or
// slopes[batch * heads + head] ([batch, heads]).
double alibi_slope(const Problem& problem, int batch, int head);

// The rule that keeps modified scores in fp32's exp2-domain range (AttentionOptions): a score at or
// below -kScoreLimit masks its key (-inf), one above +kScoreLimit is clamped to it, NaN stays NaN.
// kernels/common/score_mods.cuh's limit_score is its device twin.
constexpr double kScoreLimit = 1e38;
double limit_score(double score);

// The factor dropout puts on P[row, key] (row the flat [batch, heads, seq_q] index): 1 without
// dropout_keep, else 1 / (1 - dropout_p) when kept and 0 when dropped.
double dropout_factor(const Problem& problem, size_t row, int key);

// The sink logit of `head`: -inf without sinks.
double sink_logit(const Problem& problem, int head);

// Keys [begin, end) that query `row` sees under the causal mask and the sliding window: the mask in
// one place (kernels/common/causal_mask.cuh is its device twin). With i' = aligned_row(row):
//   end = min(visible_keys(row), i' + window_right + 1), begin = max(0, i' - window_left)
// (-1: that side unbounded); an empty range has begin == end, both in [0, len_k].
struct KeyRange {
  int begin = 0, end = 0;
};
KeyRange visible_key_range(int row, int seq_q, int len_k, Causal causal, int window_left, int window_right);

// Row `row` of batch `batch` of a problem, with every rule that places it (key lengths, key_start,
// q_offset, the causal mask, the window): the keys it sees and the key position it is aligned with
// (ALiBi's i'). Without key_start and q_offset: visible_key_range() and aligned_row() over the
// batch's length. With them (attention.h): its keys are [start, length), where start is key_start
// clamped to [0, length]; i' = start + q_offset + row (q_offset clamped to [0, 2^31 - 2^16]), or,
// without q_offset, start + row (top_left) or length - seq_q + row; a causal mask ends the range at
// i' + 1 and the window bounds it as before, never below start.
struct RowKeys {
  KeyRange keys;
  int64_t aligned = 0;
};
RowKeys row_keys(const Problem& problem, int batch, int row);

// ---- KV cache semantics (selfattn/kv_cache.h) ----

// A cache on the host: a pool of pages [num_pages, kv_heads, page_size, head_dim] for K (v_dim() for
// V), contiguous. A contiguous cache is one page per sequence (page_size = capacity) with an empty
// block table. (A latent cache's V, a view of K's leading columns, is imaged as a copy of them.)
struct KvCacheImage {
  int batch = 0, kv_heads = 1, head_dim = 1;
  int head_dim_v = 0;  // V's rows where they differ from K's; 0: head_dim
  int num_pages = 0, page_size = 1, max_pages_per_seq = 1;
  std::vector<double> k, v;          // [num_pages, kv_heads, page_size, head_dim or v_dim()]
  std::vector<int32_t> block_table;  // [batch, max_pages_per_seq]; empty: sequence b is page b
  std::vector<int32_t> lengths;      // [batch]
  std::vector<int32_t> batch_index;  // contiguous: [batch], sequence b's page (row); empty: page b

  int capacity() const { return page_size * max_pages_per_seq; }
  // Sequence b's length clamped to [0, capacity] (what the kernels use).
  int length(int b) const;
  // The page of token t of sequence b, or -1 when t is outside [0, capacity) or the block table
  // names a page outside [0, num_pages).
  int page_of(int b, int t) const;
  // Index of element 0 of token t's row for kv head h in k (page = page_of(b, t) >= 0); in v.
  size_t offset(int page, int head, int t) const;
  size_t v_offset(int page, int head, int t) const;
  int v_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
};

// Rotary tables (selfattn::Rotary): cos, sin [max_position, rotary_dim / 2].
struct RotaryTable {
  std::vector<double> cos, sin;
  int max_position = 0, rotary_dim = 0;
  bool interleaved = false;
  std::vector<int32_t> positions;  // empty, or [batch]: selfattn::Rotary::positions
  int position_step = 1;
  int first_dim = 0;  // selfattn::Rotary::first_dim: the rotated elements start there
  // Where row s of sequence b is rotated: positions[b] + position_step * s, or without positions
  // the call's default_row0 + s (selfattn::Rotary).
  int64_t position(int b, int64_t default_row0, int s) const {
    return positions.empty() ? default_row0 + s : int64_t(positions[size_t(b)]) + int64_t(position_step) * s;
  }
};

// Rotates rotary_dim elements of one row from rotary.first_dim on at `position` (clamped to the
// table's rows).
void rotate_row(double* row, int head_dim, int position, const RotaryTable& rotary);

// OCP FP8 (DType::e4m3, e5m2; types.h), defined from the format alone (sign, exponent with bias 7
// or 15, 3 or 2 mantissa bits, subnormals; e4m3: S.1111.111 is NaN, no infinities; e5m2: exponent
// 31 is infinity or NaN), independently of cuda_fp8.h, in double.
// The value of code `bits` (NaN for a NaN code).
double fp8_value(DType format, uint8_t bits);
// The code of x rounded to the nearest FP8 value, ties to the even mantissa, saturating: a
// magnitude beyond the largest finite value (+-448 e4m3, +-57344 e5m2), an infinity too, gives
// that value; NaN gives 0x7f (positive NaN); -0 gives 0x80.
uint8_t fp8_code(DType format, double x);
// fp8_value(fp8_code(x)).
double fp8_round(DType format, double x);

// An FP8 cache's format and scales (real value = stored x scale), each [kv_heads] (a per-tensor
// scale repeated), for append_kv's quantization.
struct KvQuantization {
  DType format = DType::e4m3;
  std::vector<double> k_scale, v_scale;
};

// append_kv: token t of k_new/v_new ([batch, kv_heads, seq_new, head_dim or v_dim()]) to position
// lengths[b] + t (length clamped), k rotated at that position when rotary is given; tokens past the
// capacity or in a page outside the pool are dropped. lengths are not changed. With `fp8` the image
// receives each value quantized as the library does (kv_cache.h): q = fp8_code(fl32(fl32(x) /
// fl32(scale))) - the quotient in fp32 - and holds fp8_value(q) x scale; x is k rotated in double
// (the library rotates in fp32: a rotated value may differ by one FP8 step) or v as given.
void append_kv(KvCacheImage& cache, const std::vector<double>& k_new, const std::vector<double>& v_new, int seq_new,
               const RotaryTable* rotary = nullptr, const KvQuantization* fp8 = nullptr);

// Sequence b's first length(b) tokens as [kv_heads, length, head_dim] and [kv_heads, length, v_dim()]
// (rows in a bad page are 0).
void gather_kv(const KvCacheImage& cache, int b, std::vector<double>& k, std::vector<double>& v);

// attention_with_kv_cache: problem gives batch, heads, kv_heads, seq_q, head_dim (head_dim_v is the
// cache's v_dim()), causal, scale and
// the score modifiers (key_lengths is ignored: each sequence has cache.length(b) keys; seq_k is the
// cache's capacity, the key extent of the bias [batch, heads, seq_q, capacity]). q is
// [batch, heads, seq_q, head_dim]; with rotary, row i of sequence b is rotated at position
// lengths[b] - seq_q + i first.
Result attention_with_kv_cache(const Problem& problem, const std::vector<double>& q, const KvCacheImage& cache,
                               const RotaryTable* rotary = nullptr);

// Sequence b's part of such a problem, over its first `length` cache tokens: batch 1, seq_k =
// length, its row of [batch, heads] ALiBi slopes and its bias [1, heads, seq_q, length] (the first
// length keys of its [heads, seq_q, capacity] slice).
Problem kv_sequence_problem(const Problem& problem, int b, int length);

// merge_states: the attention over the union of two disjoint key sets from the results over each
// (rows of head_dim values; a row with both LSE -inf gives 0 and -inf).
Result merge_states(const Result& a, const Result& b, int head_dim);

}  // namespace selfattn::reference
