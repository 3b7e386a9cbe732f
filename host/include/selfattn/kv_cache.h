#pragma once
// Inference over a KV cache: appending new tokens' K/V (optionally rotary-embedded), attention of a
// few new query rows per sequence against the cache, and merging partial attention results.
//
// The cache is memory the caller owns; the library only views it. Two layouts:
//   contiguous  k, v: [batch, kv_heads, capacity, head_dim], any strides (TensorView::bhsd/bshd or a
//               slice of something larger). Sequence b's token t is row t of batch b.
//   paged       k, v: a pool of pages viewed as [num_pages, kv_heads, page_size, head_dim] with any
//               strides, so both common pool layouts are plain TensorViews:
//                 [num_pages, page_size, kv_heads, d]  TensorView::bshd(data, dtype, num_pages, kv_heads, page_size, d)
//                 [num_pages, kv_heads, page_size, d]  TensorView::bhsd(data, dtype, num_pages, kv_heads, page_size, d)
//               block_table (device int32 [batch, max_pages_per_seq], row-major) maps sequence b's
//               token t to page block_table[b][t / page_size], row t % page_size. Pages may be
//               shared between sequences (a common prefix) and appear in any order. Any page size
//               from 1 works on every path (1, 16, 64 and 256 are among the tested ones).
// lengths (device int32 [batch]) holds each sequence's number of valid tokens.
// k and v share every extent but the head dim: K's rows are q's head_dim long, V's are head_dim_v
// = v.shape[3] long (out's), any two sizes (MLA's (192, 128) rows; the split-KV kernels take each up
// to 256, the naive and cublas paths any).
//
// Latent caches (DeepSeek's MLA, absorbed): V may be a view of K's leading columns - v with k's
// data and strides and v.shape[3] <= k.shape[3], e.g. K rows [c_kv (512) | k_rope (64)] and V their
// first 512 columns - one pool that both products read. That is the only overlap of k and v
// allowed. append_kv then writes K's rows only (V's are among them), and takes v_new as the same
// view of k_new; an FP8 such cache has one scale for both (v_scale == k_scale). Rotary on the
// rotary part alone: Rotary::first_dim (e.g. 512, rotary_dim 64).
//
// FP8 caches (k and v of DType::e4m3 or e5m2, OCP FP8 as __nv_fp8_e4m3 / __nv_fp8_e5m2) halve the
// bytes decode reads against f16/bf16. Each comes with float32 dequantization scales, the
// convention of vLLM and FlashInfer: real value = stored x scale, per tensor (scale_count 1) or per
// kv head (scale_count kv_heads, kv head h's at [h]), separately for K (k_scale) and V (v_scale).
//   append_kv   k_new/v_new are f32, f16 or bf16 (the two alike): K rotated first (rotary, in fp32),
//               then each value divided by its scale in fp32 and rounded to nearest even into the
//               FP8 format, saturating to its finite range (+-448 e4m3, +-57344 e5m2; infinities
//               too); NaN stays NaN.
//   attention   q/out are f32, f16 or bf16 (the two alike, any of the three): the cache is
//               dequantized in registers, stored x scale in fp32, and attended as an f32/f16/bf16
//               cache would be. fused: the split-KV kernels dequantize while staging K/V - the
//               tensor-core one for f16/bf16 q at head_dim 64 and 128 (K/V rows on 8 bytes, q's on
//               16; stored x scale in fp32, rounded once to q's dtype for the mma), the SIMT one
//               (fp32) otherwise; naive/cublas: the gather dequantizes into q's dtype (one rounding
//               to it) and the path runs on that.
// Choosing the scales (e.g. amax / 448 from calibration) and keeping them finite and > 0 is the
// caller's job; the library reads them on the device and never checks their values.
//
// Device metadata (block_table, lengths) is never read by the host unless options.validate_metadata
// asks: kernels clamp every index they derive from it to the views they were given, so a wrong
// entry can give wrong numbers but never a read or write outside the caller's buffers (a length is
// clamped to [0, capacity]; a page index outside [0, num_pages) reads as zeros and is never written).
//
// Graph safety (CUDA graph capture): append_kv, attention_with_kv_cache, merge_states and
// cu_seqlens_from_lengths make no host-device synchronisation, no host read of device data and,
// once the context's workspace has grown to the shape (run the shape once before capturing), no
// allocation - unless options.validate_metadata is set, which copies the metadata to the host
// (synchronous, not graph-safe). attention_varlen() on the naive and cublas paths reads cu_seqlens
// back and is not graph-safe, nor is attention_with_kv_cache_varlen there; attention() with
// key_lengths is. tests/kv_cache/test_kv_cache_graph proves the graph-safe ones on the sim.
//
// Why appending is a separate call and not part of attention_with_kv_cache: the cache is the
// engine's state, and a call that both mutates it and computes would either write the cache before
// all its arguments are known to be valid or need a second validation pass; engines also attend to
// the same appended tokens more than once (cascade / shared-prefix attention, speculative
// verification), and the attention kernels stay read-only on the cache, so no block can see
// another block's half-written token. The cost is one small extra launch per layer.
#include <cstdint>
#include <optional>

#include "selfattn/context.h"
#include "selfattn/mask_options.h"
#include "selfattn/tensor.h"
#include "selfattn/types.h"

namespace selfattn {

struct KvCache {
  TensorView k, v;                       // contiguous: [batch, kv_heads, capacity, d]; paged: the page pool
  const int32_t* block_table = nullptr;  // device [batch, max_pages_per_seq]; null: contiguous cache
  int batch = 0;                         // sequences (contiguous: k.batch(), unless batch_index maps them)
  int max_pages_per_seq = 0;             // paged only
  const int32_t* lengths = nullptr;      // device [batch]: valid tokens per sequence
  // Contiguous only, device int32 [batch] or null: sequence b's tokens are the cache's row
  // batch_index[b] (FlashAttention's cache_batch_idx), so `batch` may differ from k.batch() and a
  // row may serve several sequences' reads. A row outside [0, k.batch()) reads as no token (zeros)
  // and is never written; append_kv with two sequences on one row writes it in no set order.
  const int32_t* batch_index = nullptr;
  // FP8 caches only (required with k/v e4m3 or e5m2, refused otherwise): device fp32
  // dequantization scales, real value = stored x scale; scale_count 1 (per tensor) or kv_heads
  // (per kv head). Must not overlap k, v, out or lse.
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  int scale_count = 0;

  bool paged() const { return block_table != nullptr; }
  // Tokens one sequence can hold: k.seq() (contiguous) or max_pages_per_seq * page_size (paged); at
  // most 2^31 - 2^16, as every dimension (attention.h).
  int64_t capacity() const { return paged() ? int64_t(max_pages_per_seq) * k.seq() : k.seq(); }

  static KvCache contiguous(const TensorView& k, const TensorView& v, const int32_t* lengths) {
    KvCache cache;
    cache.k = k;
    cache.v = v;
    cache.batch = int(k.batch());
    cache.lengths = lengths;
    return cache;
  }
  static KvCache paged_pool(const TensorView& k_pages, const TensorView& v_pages, const int32_t* block_table,
                            int batch, int max_pages_per_seq, const int32_t* lengths) {
    KvCache cache;
    cache.k = k_pages;
    cache.v = v_pages;
    cache.block_table = block_table;
    cache.batch = batch;
    cache.max_pages_per_seq = max_pages_per_seq;
    cache.lengths = lengths;
    return cache;
  }
};

// Rotary position embedding with the caller's tables: cos and sin are device [max_position,
// rotary_dim / 2] (row-major) of table_dtype (fp32, or f16/bf16 as many models keep them: read as
// they are, no copy); the rotary_dim elements of each row from first_dim on (usually its first
// ones) are rotated by the angle of the row's position, the rest pass through. Pairs, counted from
// first_dim, are (2i, 2i+1) when interleaved (GPT-J style), (i, i + rotary_dim/2) otherwise
// (half-split, GPT-NeoX style):
//   x'_a = x_a cos - x_b sin,  x'_b = x_a sin + x_b cos   (in fp32, rounded once to the dtype).
// A position outside [0, max_position) (only possible with wrong device lengths or positions)
// uses the nearest row.
struct Rotary {
  const void* cos = nullptr;
  const void* sin = nullptr;
  int max_position = 0;
  int rotary_dim = 0;  // even, 2..head_dim - first_dim
  bool interleaved = false;
  // The first rotated element of a row: 0, or e.g. 512 for MLA's rows [latent (512) | rope (64)].
  int first_dim = 0;
  // Where rows are rotated. Device int32 [batch] or null: row (token) s of sequence b at
  // positions[b] + position_step * s; null: the call's own rule (append_kv: the token's slot,
  // lengths[b] + s; attention_with_kv_cache: the row's place at the end of the cache,
  // lengths[b] - seq_q + s; rotary_embedding: s). position_step is 1 (consecutive rows) or 0 (every
  // row of a sequence at positions[b]: FlashAttention's rotary for q when a call is neither causal
  // nor local). With left padding (key_start) the positions of the first real token is 0: pass
  // lengths[b] - key_start[b] here, as FlashAttention's cache_leftpad does.
  const int32_t* positions = nullptr;
  int position_step = 1;
  DType table_dtype = DType::f32;  // of cos and sin: f32, f16 or bf16
};

struct AppendKvOptions {
  std::optional<Rotary> rotary;  // applied to k_new on the way into the cache (v is never rotated)
  // Device int32 [batch] or null: receives min(lengths[b] + seq_new, capacity), the lengths to pass
  // to the next attention call. Must not overlap cache.lengths (blocks still read those).
  int32_t* updated_lengths = nullptr;
  // Copies lengths and block table to the host and throws InvalidArgument naming the first bad
  // entry (a length < 0 or with lengths[b] + seq_new > capacity, a page index outside the pool, a
  // batch_index row outside the cache; a packed call's offsets, see "Packed calls"), the message
  // ending with what the kernels would have done with it unchecked. Synchronous: not graph-safe.
  bool validate_metadata = false;
};

// Writes token t of k_new/v_new ([batch, kv_heads, seq_new, d], the cache's dtype - an FP8 cache:
// f32, f16 or bf16, quantized on the way - and d: K's head_dim, V's head_dim_v; with V a view of K,
// v_new is the same view of k_new) at position cache.lengths[b] + t of sequence b, across
// page boundaries. The cache's lengths are not changed (see updated_lengths). Tokens that would land past the capacity,
// or in a page outside the pool, are dropped. k_new/v_new must not overlap the cache. Uses no workspace.
void append_kv(Context& ctx, const KvCache& cache, const TensorView& k_new, const TensorView& v_new,
               const AppendKvOptions& options = {});

// The options of the cache's attention calls. The masks and score modifiers are MaskOptions
// (mask_options.h), as attention() takes them, on every path; here row i of sequence b sits at cache
// position i' = lengths[b] - seq_q + i (the bottom-right alignment, with causal none too), so a window
// or an ALiBi distance is measured from the new token's own position; q_offset[b] replaces the
// default lengths[b] - key_start[b] - seq_q (row i then sees the tokens at positions <=
// q_offset[b] + i under bottom_right); key_start[b]'s tokens before it are never read. Neither moves
// the rotary positions below. The bias is [batch, heads, seq_q, capacity] (keys by cache position,
// so one view serves every step while lengths grow); a row that sees no cache token (length 0)
// outputs 0 and LSE sink[h] with sinks. The fused path reads only the key tiles inside a window.
struct KvAttentionOptions : MaskOptions {
  Path path = Path::automatic;
  // bottom_right: new query row i of sequence b (seq_q rows) sees cache tokens [0, lengths[b] - seq_q + i];
  // none: every cached token. (top_left is rejected: it has no meaning against a cache.)
  Causal causal = Causal::bottom_right;
  std::optional<float> scale;  // default 1/sqrt(head_dim)
  float* lse = nullptr;        // device fp32 [batch, heads, seq_q], natural log; -inf for a row without keys
  // Applied to q (at positions lengths[b] - seq_q + i) before attending; the cache is read as it is.
  std::optional<Rotary> rotary;
  // Fused path only: the key range of each (sequence, kv head) is split over this many blocks
  // (flash-decoding), 0..4096; 0 lets the library choose from the work and the GPU's size.
  // More splits than key tiles is allowed (the extra splits are empty and weigh nothing).
  int num_splits = 0;
  // As in AppendKvOptions (checks lengths[b] <= capacity and the pages lengths[b] uses).
  bool validate_metadata = false;
};

// out[b, h, i] = attention of query row i of sequence b over the cache tokens it sees (see causal),
// after the new tokens were appended (append_kv). q: [batch, heads, seq_q, head_dim] and out:
// [batch, heads, seq_q, head_dim_v], the cache's dtype (an FP8 cache: f32, f16 or bf16, out of
// q's); heads a multiple of the cache's kv_heads (GQA/MQA). A
// sequence with length 0 gives rows of 0 and LSE -inf (with sinks, the head's sink logit). Paths:
//   fused (and automatic, for head_dim and head_dim_v <= 256, and DeepSeek's latent cache): the
//     split-KV decode kernel reads the cache in place; the query heads sharing a kv head are
//     processed together, so each K/V element is read once per kv head. Tensor cores (mma.sync)
//     for f16/bf16 at head_dim = head_dim_v = 64 or 128 when every q, K and V row starts on 16
//     bytes; a SIMT kernel with fp32 arithmetic for everything else up to 256. A latent cache (V a
//     view of K's leading columns) at (576, 512) with f16/bf16 q has its own tensor-core kernel
//     (each cached row staged once for both products, 16 query rows - heads x new rows - per
//     block), also over an e4m3 cache with bf16 q; other shapes above 256 are refused by name.
//     FP8 caches: the same choice with K/V rows on 8 bytes (8 FP8 values per load) instead of 16.
//     Any page size works at the same cost per key (each key's page is looked up once per tile);
//     K/V rows that start on 16 bytes and fill whole 16-byte chunks (e.g. f16/bf16 with head_dim a
//     multiple of 8, base and strides aligned) are read with 16-byte loads, others element-wise.
//   naive, cublas (and automatic above 256): the sequences' K/V are copied into the
//     workspace and the path runs on them as on a padded batch with key lengths (V gathered on
//     its own also when it is a view of K).
// Workspace (what ContextOptions::workspace_limit counts), in bytes, each piece rounded up to 256,
// with rows = batch * heads * seq_q and e = dtype_size(q.dtype) (the gathered K and V are q's dtype,
// also from an FP8 cache):
//   with options.rotary: the rotated q, rows * head_dim * e; then
//   fused: with more than one split (num_splits, or the library's choice), the partial results,
//     splits * rows * head_dim_v * 4 and splits * rows * 4; nothing with one split;
//   naive, cublas: K and V gathered, batch * kv_heads * capacity * head_dim * e and the same with
//     head_dim_v, then the
//     scores of attention() (context.h) with seq_k = capacity, chunked in what remains.
// WorkspaceTooSmall, before anything is written, exactly when this with a chunk of one query row
// exceeds the limit. No query row or no cache slot (capacity 0) counts nothing.
void attention_with_kv_cache(Context& ctx, const TensorView& q, const KvCache& cache, const TensorView& out,
                             const KvAttentionOptions& options = {});

// ---- Packed calls: sequences with different numbers of new rows (continuous batching) ----
// A serving engine's step mixes prefill chunks and single-token decodes over one cache: sequence b
// has its own number of new rows n_b (0 allowed), packed without padding as attention_varlen packs
// them (FlashAttention's varlen layout): rows [cu_seqlens[b], cu_seqlens[b+1]) of a view
// [1, heads, total, head_dim]. cu_seqlens is device int32 [cache.batch + 1] starting at 0
// (cu_seqlens_from_lengths makes it from per-sequence counts); max_seqlen bounds every n_b.
// Everything else is the dense call's, with n_b for seq_q / seq_new per sequence.
//
// Device metadata is clamped as in the dense calls, and cu_seqlens too: the kernels read it
// through its running maximum (so offsets out of order give empty sequences, never two sequences
// sharing a row), each entry clamped into [0, total], each n_b to at most max_seqlen. Rows no
// sequence owns (past cu_seqlens[batch]; with clamped offsets also past a sequence's first
// max_seqlen) are neither read nor written: out and lse keep what they held there (except with a
// cache of capacity 0, which zeroes every row of out as attention_varlen() does without keys).
// Where cu_seqlens is checked (InvalidArgument naming the entry, e.g.
// "cu_seqlens_q[3] = 24 runs past q's 16 rows (sequence 2: rows [16, 24))", before anything is
// written; the rules: starts at 0, non-decreasing, n_b <= max_seqlen, ends at most at total):
//   validate_metadata, on every path: copies it to the host with the rest of the metadata (the
//     message ends by saying what the kernels would have clamped without it);
//   attention_with_kv_cache_varlen on naive and cublas: always, as they read cu_seqlens_q back;
//   the fused path and append_kv_varlen otherwise: never (clamped as above, graph-safe).
// (The Python package checks a packed call's metadata given as host arrays itself, on every path.)
// Workspace: besides the dense call's, the ordered offsets, 256-byte-rounded (batch + 1) int32.

// append_kv with k_new, v_new [1, kv_heads, total_new, head_dim]: token t of sequence b (row
// cu_seqlens_new[b] + t) goes to position lengths[b] + t; updated_lengths[b] receives
// min(lengths[b] + n_b, capacity). Graph-safe once the workspace holds the ordered offsets.
void append_kv_varlen(Context& ctx, const KvCache& cache, const TensorView& k_new, const TensorView& v_new,
                      const int32_t* cu_seqlens_new, int max_seqlen_new, const AppendKvOptions& options = {});

// attention_with_kv_cache with q, out [1, heads, total_q, head_dim]: row i of sequence b (row
// cu_seqlens_q[b] + i) sits at cache position lengths[b] - n_b + i (causal bottom_right sees the
// tokens up to it; the window, ALiBi and q's rotary measure from it; q_offset and rotary.positions
// move it as in the dense call). options.lse, when set, is [heads, total_q]; options.bias is
// [batch, heads, max_seqlen_q, capacity], sequence b's rows counted from 0. Paths:
//   fused: the split-KV kernel serves every sequence in one launch, decode rows and prefill chunks
//     alike: a block takes up to 16 rows of one (sequence, kv head) group, so a chunk of n rows
//     reads its keys ceil(n * heads_per_kv / 16) times (the prefill kernel's 64-128-row tiles
//     would read them fewer times; bench/NOTES.md). Graph-safe once the workspace is warm.
//   naive, cublas: the cache is gathered as in the dense call and attention_varlen() runs on it,
//     reading cu_seqlens_q back to the host (synchronising; not graph-safe) and checking it first
//     (InvalidArgument naming the entry of cu_seqlens_q and its sequence, as above).
void attention_with_kv_cache_varlen(Context& ctx, const TensorView& q, const int32_t* cu_seqlens_q, int max_seqlen_q,
                                    const KvCache& cache, const TensorView& out,
                                    const KvAttentionOptions& options = {});

// Rotary position embedding on its own (for a model that rotates q and k itself, say before
// attention() or attention_varlen()): out[b, h, s] = x[b, h, s] with its rotary.rotary_dim
// elements from rotary.first_dim on rotated at rotary.positions[b] + rotary.position_step * s (positions null: at s).
// x, out: [batch, heads, seq, head_dim] of one dtype, any strides (head_dim's 1); out must not
// overlap x (each element is computed from itself and its partner). Uses no workspace.
void rotary_embedding(Context& ctx, const TensorView& x, const TensorView& out, const Rotary& rotary);

// Merges two attention results over disjoint key sets of the same query rows into the result over
// their union: with m = max(lse_a, lse_b), w_x = exp(lse_x - m),
//   out = (w_a out_a + w_b out_b) / (w_a + w_b),  lse = m + log(w_a + w_b)
// (a row with both LSE -inf gives 0 and -inf). out_a, out_b, out: [batch, heads, seq, head_dim] of
// one dtype; lse_a, lse_b, lse_out: device fp32 [batch, heads, seq] contiguous. out may be exactly
// out_a (same data and strides) and lse_out exactly lse_a, for merging in place; no other overlap.
// lse_out may be null.
void merge_states(Context& ctx, const TensorView& out_a, const float* lse_a, const TensorView& out_b,
                  const float* lse_b, const TensorView& out, float* lse_out);

// Device-side prefix sum for engines that keep per-sequence lengths and need varlen offsets:
// cu_seqlens (device int32 [batch + 1]) = 0, l0, l0 + l1, ... from lengths (device int32 [batch]),
// computed on the device (CUB's DeviceScan on cuda) without a host read. Lengths are summed as
// given (negative ones are the caller's bug; attention_varlen's fused path orders and clamps
// whatever comes out). Graph-safe once the context's workspace holds the scan's scratch (run once first).
// lengths and cu_seqlens must not overlap. Workspace: the scan's scratch (cuda: what CUB's
// DeviceScan asks for `batch` items; sim: none), reserved before cu_seqlens is written.
void cu_seqlens_from_lengths(Context& ctx, const int32_t* lengths, int batch, int32_t* cu_seqlens);

}  // namespace selfattn
