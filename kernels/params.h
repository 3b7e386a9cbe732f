#pragma once
// Kernel parameter structs: plain data, the same for nvcc and the host compiler. One struct per
// kernel, passed by value as the kernel's only argument.
#include <cstdint>

namespace selfattn::kernels {

enum class Element : uint8_t { f32, f16, bf16 };

// An FP8 element (selfattn::DType::e4m3 / e5m2): __nv_fp8_e4m3 / __nv_fp8_e5m2, real value = stored x
// a scale (a KV cache's KvPagesView::k_scale, v_scale; FP8 attention inputs' descales).
enum class CacheElement : uint8_t { e4m3, e5m2 };

// A bias's elements: the tensors' types, or b8 (booleans: nonzero may attend, 0 masks the key,
// as an additive 0 / -inf; selfattn::DType::b8).
enum class BiasElement : uint8_t { f32, f16, bf16, b8 };

// Which keys a query row sees: the same three rules as selfattn::Causal (types.h), applied by
// visible_key_range() in causal_mask.cuh.
enum class CausalMask : uint8_t { none, top_left, bottom_right };

// Which keys a query row sees beyond the causal mask, and what happens to its scores before the
// softmax (AttentionOptions in attention.h; applied by score_mods.cuh, window in causal_mask.cuh).
// Every kernel that computes a softmax takes one of these.
struct ScoreMods {
  int window_left, window_right;  // sliding window around the aligned row; -1: unbounded on that side
  float softcap;                  // > 0: s -> softcap * tanh(s / softcap); 0: off
  const float* alibi_slopes;      // [batch, heads] or [heads] (alibi_stride_batch 0); null: off
  int64_t alibi_stride_batch;
  const void* bias;               // additive bias, element (b, h, row, key) at the strides below; null: off
  BiasElement bias_element;
  int64_t bias_stride_batch, bias_stride_head, bias_stride_row, bias_stride_key;  // 0 broadcasts
  int bias_rows, bias_keys;       // extent of the bias: rows or keys outside it are masked, never read
  // True when softcap, ALiBi or bias change score values (the window only masks). Kernels test it
  // once so calls without them keep their original arithmetic.
  bool changes_values;
  // Attention sinks: [heads], each query head's sink logit (natural log; -inf: none for that head),
  // one more term of every row's softmax denominator (softmax_row_end); null: off.
  const float* sinks;
  // Dropout on the probabilities (common/dropout.cuh has the rule). dropout_threshold 0: off, and
  // every kernel's arithmetic is what it is without dropout; else an element is dropped when its
  // Philox word is below it (floor(p * 2^32)) and kept ones are scaled by dropout_scale = 1 / (1 - p).
  uint32_t dropout_threshold;
  float dropout_scale;
  uint64_t dropout_seed, dropout_offset;
  int dropout_heads;       // the call's query heads: stream = (batch + dropout_batch_base) * heads + head
  int dropout_batch_base;  // the first sequence of the kernel's batch 0 (a varlen call's naive/cublas
                           // per-sequence calls); 0 otherwise
};

// lse_without_keys.cuh: the LSE of rows that see no key at all (the call has no keys): each row's
// head's sink logit, or -inf without sinks. Row r belongs to head (r / rows_per_head) % heads.
struct LseWithoutKeysParams {
  float* lse;
  const float* sinks;  // [heads] or null
  int64_t rows, rows_per_head;
  int heads;
};

// gemm_key_repair.cuh: one strided-batched column-major GEMM C = alpha op(A) op(B) already computed
// over all k, and the keys its sum should have run over, which depend on device data (a key
// length): C's column c is query row row_begin + c of a sequence of seq_q queries over seq_k keys,
// op(A)'s row i is key key_offset + i, and the sum for column c runs over the keys that row sees
// (visible_key_range in causal_mask.cuh, under the batch's length).
struct GemmKeyRepairParams {
  const void* a;
  const void* b;
  void* c;
  Element a_element, c_element;  // B is of A's element type (as cuBLAS takes them)
  bool trans_a, trans_b;
  int m, n, k, batch_count;
  int64_t lda, ldb, ldc, stride_a, stride_b, stride_c;
  float alpha;
  const int32_t* key_length;  // this batch's entry of key_lengths, or null
  const int32_t* key_start;   // this batch's entry of key_start, or null (sequence_keys())
  const int32_t* q_offset;    // this batch's entry of q_offset, or null
  int key_offset, row_begin, seq_q, seq_k;
  CausalMask causal;
  int window_left, window_right;  // -1: unbounded on that side
};

// dequantize_fp8.cuh: one FP8 tensor (attention's q, k or v; any strides) into a contiguous
// [batch, heads, seq, head_dim] buffer of the path's element, each value stored x the descale of
// its (batch, kv head): descale[b * kv_heads + h / heads_per_descale] (null: 1). Varlen views are
// [1, heads, total, d]: row r's "batch" is then its sequence, the last s with cu_seqlens[s] <= r.
// Its launch (the host sizes the grid with it): (ceil(seq / kRowsPerBlock), heads, batch).
struct DequantizeFp8Traits {
  static constexpr int kThreads = 256;
  static constexpr int kRowsPerBlock = 8;  // 8 rows of 128 values: 4 per thread, enough to hide a load
};
struct DequantizeFp8Params {
  const void* in;
  void* out;
  const float* descale;
  int64_t in_stride_batch, in_stride_head, in_stride_row;
  int batch, heads, seq, head_dim;
  int kv_heads, heads_per_descale;  // q: heads / kv_heads query heads share a descale; k, v: 1
  const int32_t* cu_seqlens;        // varlen: [sequences + 1] (any values: the search stays in range)
  int sequences;
};

struct FillParams {
  float* data;
  int64_t count;
  float value;
};

}  // namespace selfattn::kernels
