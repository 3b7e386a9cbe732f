#pragma once
#include <cstddef>
#include <cstdint>

namespace selfattn {

// b8: booleans, one byte each (0: false, anything else: true); only a bias takes them (a mask:
// AttentionOptions::bias). q, k, v and the outputs are f32, f16 or bf16.
// e4m3, e5m2: OCP FP8 (CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2), one byte each; a KV cache's K and V
// (kv_cache.h: stored with a float32 scale, real value = stored x scale) and attention's q, k and v
// (attention.h: with descale factors, AttentionOptions::q_descale) take them. e4m3: 4
// exponent bits (bias 7), 3 mantissa bits, finite range +-448, NaN 0x7f/0xff, no infinities; e5m2:
// 5 exponent bits (bias 15), 2 mantissa bits, finite range +-57344, IEEE-style infinities and NaNs.
enum class DType : uint8_t { f32, f16, bf16, b8, e4m3, e5m2 };
size_t dtype_size(DType dtype);
const char* to_string(DType dtype);
inline bool is_fp8(DType dtype) { return dtype == DType::e4m3 || dtype == DType::e5m2; }

// Where kernels run: a real GPU, or the CPU simulator that executes the same kernel source.
enum class Backend : uint8_t { cuda, sim };
const char* to_string(Backend backend);

// Which implementation computes attention.
//   automatic: the fastest built path that supports the case
//   naive:     three kernels (tiled Q K^T, fused scale+mask+softmax, tiled P V), S and P in workspace
//   cublas:    cuBLAS batched GEMMs with our softmax kernel between them
//   fused:     one flash-style kernel; the score matrix never reaches memory
enum class Path : uint8_t { automatic, naive, cublas, fused };
const char* to_string(Path path);

// Causal masking. Query row i (0-based) of a sequence with seq_q queries and len_k keys sees key j when
//   none:         always
//   top_left:     j <= i                          (row 0 sees key 0; aligned at the first key)
//   bottom_right: j <= i + (len_k - seq_q)        (the last row sees every key; aligned at the last key)
// They agree when seq_q == len_k. len_k is the batch's key length when key lengths are given, else seq_k.
// A row that sees no key outputs 0 (and LSE -inf).
// The sliding window and ALiBi (AttentionOptions) measure distances from row i's aligned key
// position i': i under top_left; i + (len_k - seq_q) under bottom_right and under none (none
// aligns at the last key, as FlashAttention's windows do). AttentionOptions::key_start and q_offset
// (attention.h) move the first key and place row 0 explicitly. reference::row_keys() and
// kernels/common/causal_mask.cuh state the whole rule.
enum class Causal : uint8_t { none, top_left, bottom_right };
const char* to_string(Causal causal);

}  // namespace selfattn
