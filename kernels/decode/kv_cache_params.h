#pragma once
// Parameters of the KV-cache kernels (kernels/decode/). Plain data, the same for nvcc and the host
// compiler. Strides are in elements; head_dim's stride is 1.
#include <cstddef>
#include <cstdint>

#include "../launch.h"
#include "../params.h"

namespace selfattn::kernels {

// A cache as the kernels see it: a pool of pages [num_pages, kv_heads, page_size, head_dim] (any
// strides) for K, the same with head_dim_v columns for V. A contiguous cache is the same thing with
// one page per sequence (page_size = capacity, block_table null: sequence b is page b). Token t of
// sequence b lives in page block_table[b * max_pages_per_seq + t / page_size], row t % page_size.
// V may be a view of K's leading columns (MLA's latent cache: v == k, the same strides,
// head_dim_v <= head_dim): the kernels read it as any V; kv_append then writes K only.
struct KvPagesView {
  void* k;
  void* v;
  int64_t k_stride_page, k_stride_head, k_stride_row;
  int64_t v_stride_page, v_stride_head, v_stride_row;
  int num_pages, page_size, kv_heads, head_dim, head_dim_v;  // head_dim: K's row (q's), head_dim_v: V's (out's)
  const int32_t* block_table;  // device, or null (contiguous)
  int max_pages_per_seq;       // 1 when contiguous
  const int32_t* lengths;      // device [batch]
  const int32_t* batch_index;  // contiguous: device [batch], sequence b's row; null: row b
  int batch;
  // FP8 caches only (null otherwise, and unread): device fp32 dequantization scales, real value =
  // stored x scale; scale_count 1 (per tensor) or kv_heads (kv head h's at [h]); kv_scale().
  const float* k_scale;
  const float* v_scale;
  int scale_count;
};

// The new rows of a call (query rows, or tokens to append), per sequence. Dense (offsets null):
// sequence b has `seq` rows, in batch entry b of the views. Packed (varlen, offsets set): sequence b
// has rows [offsets[b], offsets[b + 1]) of batch entry 0, the views holding `total` rows; the
// offsets are running maxima (running_max_offsets) so no two sequences share a row, and each is
// clamped into [0, total] and to at most `seq` (the call's max_seqlen, the grid's extent) rows, so
// device metadata can only give a sequence fewer rows, never a row outside the views
// (sequence_rows(), new_rows.cuh).
struct NewRows {
  const int32_t* offsets;  // device [batch + 1], or null: dense
  int seq;                 // rows per sequence (dense), at most (packed)
  int total;               // rows per batch entry of the views: seq (dense), total rows (packed)
};

// Rotary tables (see selfattn::Rotary): cos/sin fp32 [max_position, rotary_dim / 2].
struct RotaryTables {
  const void* cos;  // null: no rotary
  const void* sin;
  int max_position;
  int rotary_dim;
  bool interleaved;
  // [batch] or null: row (token) s of sequence b at positions[b] + position_step * s, instead of
  // the call's own default (rotary_position()).
  const int32_t* positions;
  int position_step;
  Element table_element;  // of cos and sin
  int first_dim;          // the rotated elements are [first_dim, first_dim + rotary_dim) of each row
};

// kv_append: token t of sequence b in k_new/v_new ([batch, kv_heads, seq_new, d], or packed
// [1, kv_heads, total_new, d]; v_new's d is head_dim_v) goes to position lengths[b] + t of
// sequence b. v_new null: V is a view of K (KvPagesView), written with it.
// grid (ceil(rows.seq / rows per block), kv_heads, batch).
struct KvAppendParams {
  KvPagesView cache;
  const void* k_new;
  const void* v_new;
  int64_t new_stride_batch_k, new_stride_head_k, new_stride_row_k;
  int64_t new_stride_batch_v, new_stride_head_v, new_stride_row_v;
  NewRows rows;             // the new tokens of each sequence (dense or packed)
  RotaryTables rotary;      // applied to k
  int32_t* updated_lengths; // [batch] or null; written by the blocks with blockIdx.x == 0, y == 0
};

// kv_gather: sequence b's tokens [0, capacity) to dense [batch, kv_heads, capacity, d] buffers;
// rows at or past the (clamped) length, and rows whose page is outside the pool, become zeros.
// grid (ceil(capacity / rows per block), kv_heads, batch).
struct KvGatherParams {
  KvPagesView cache;
  void* k_out;
  void* v_out;
  // Of k_out (d = head_dim) and v_out (d = head_dim_v), head_dim's stride 1: [batch, kv_heads,
  // capacity, d] or [batch, capacity, kv_heads, d], the layout a packed call views as
  // [1, kv_heads, batch * capacity, d].
  int64_t k_out_stride_batch, k_out_stride_head, k_out_stride_row;
  int64_t v_out_stride_batch, v_out_stride_head, v_out_stride_row;
  int capacity;  // per sequence: page_size * max_pages_per_seq
};

// rotary_rows: row s of sequence b (rows: dense or packed) rotated into out at position
// lengths[b] - count_b + s, the sequence's last count_b tokens (lengths null: at s), unless
// rotary.positions places it. grid (ceil(rows.seq / rows per block), heads, batch).
struct RotaryRowsParams {
  const void* in;
  void* out;
  int64_t in_stride_batch, in_stride_head, in_stride_row;
  int64_t out_stride_batch, out_stride_head, out_stride_row;
  NewRows rows;
  int head_dim;
  const int32_t* lengths;  // device [batch], or null
  RotaryTables rotary;
};

// merge_states: one thread per row; grid (ceil(rows / threads), 1, 1) over rows = batch*heads*seq.
struct MergeStatesParams {
  const void* out_a;
  const void* out_b;
  void* out;
  int64_t a_stride_batch, a_stride_head, a_stride_row;
  int64_t b_stride_batch, b_stride_head, b_stride_row;
  int64_t o_stride_batch, o_stride_head, o_stride_row;
  const float* lse_a;
  const float* lse_b;
  float* lse_out;  // or null
  int heads, seq, head_dim;
  int64_t rows;
};

// decode_split_kv: attention of the new query rows over a cache, the keys of each (sequence, kv
// head) split into num_splits ranges (flash-decoding). The query heads sharing a kv head are one
// group of heads_per_kv * count_b rows (count_b: sequence b's query rows), processed together so
// each K/V element is read once per kv head. grid (num_splits * row_blocks, kv_heads, batch), the
// row blocks covering heads_per_kv * q_rows.seq rows. With one split the block writes out/lse
// itself; otherwise each split writes its normalised partial O and LSE to fp32 workspace and
// decode_combine merges them. A row's out, lse and partials sit at its flat index
// (entry * heads + head) * q_rows.total + first + i (new_rows.cuh).
struct DecodeSplitKvParams {
  KvPagesView cache;
  const void* q;
  void* out;
  int64_t q_stride_batch, q_stride_head, q_stride_row;
  int64_t out_stride_batch, out_stride_head, out_stride_row;
  float* lse;            // [batch, heads, seq_q] (packed: [heads, total_q]) or null
  float* partial_out;    // [num_splits, rows, head_dim_v] (rows = flat indices), fp32
  float* partial_lse;    // [num_splits, rows]
  int64_t rows;
  NewRows q_rows;
  int heads, head_dim, heads_per_kv;  // head_dim: q's and K's; out's and V's is cache.head_dim_v
  int num_splits, row_blocks;
  float scale;           // softmax scale (the modifiers take scores in natural-log units)
  float scale_log2;      // softmax scale * log2(e)
  CausalMask causal;     // none or bottom_right, against each sequence's length
  // [batch] or null each: keys before key_start[b] are padding; q_offset[b] is row 0's position
  // counted from key_start (sequence_keys() in causal_mask.cuh).
  const int32_t* key_start;
  const int32_t* q_offset;
  // Window, softcap, ALiBi, bias (score_mods.cuh); the bias is [batch, heads, q_rows.seq, capacity],
  // rows the new query rows, keys cache positions. Rows are aligned bottom-right unless q_offset
  // places them (aligned_key).
  ScoreMods mods;
  bool vector_loads;     // every K/V row starts on 16 bytes and head_dim fills 16-byte chunks
};

// decode_combine: out and lse of each row from its num_splits partial results, over the flat
// indices of decode_split_kv. grid (rows, or fewer: the blocks stride).
struct DecodeCombineParams {
  const float* partial_out;
  const float* partial_lse;
  void* out;
  int64_t out_stride_batch, out_stride_head, out_stride_row;
  float* lse;  // or null
  const float* sinks;  // [heads] sink logits, or null (ScoreMods::sinks)
  int64_t rows;
  NewRows q_rows;  // packed: only the rows a sequence owns are combined (packed_row_owned)
  int batch;       // sequences (packed)
  int heads, head_dim, num_splits;  // head_dim: out's (the cache's head_dim_v)
};

// One kernel instance with the block size the host launches it with.
struct DecodeKernel {
  KernelRef kernel;
  int threads = 0;
  int rows_per_block = 0;
  size_t smem_bytes = 0;  // dynamic shared memory
  int max_head_dim = 0;   // decode_split_kv: the largest head_dim it takes
};

}  // namespace selfattn::kernels
