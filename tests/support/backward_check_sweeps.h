#pragma once
// The backward check's case lists (backward_check.h): the sweep both score paths run, the sinks and
// unowned-row cases every path must survive, and the fused path's sweep.
#include <string>
#include <vector>

#include "backward_check_case.h"

namespace selfattn::backward_check {

// The case on `path`, its name prefixed with the path, dtype and gradient dtype.
inline Case on_path(Path path, Case c) {
  c.path = path;
  c.name = std::string(to_string(path)) + "_" + to_string(c.dtype) + (c.grad_f32 ? "_gradf32_" : "_") + c.name;
  return c;
}

// The sweep both score paths run (sim and GPU): every dtype x gradient dtype, causal both alignments,
// GQA, odd shapes (113 x 203, head_dim 7), key lengths with a zero, varlen with empty sequences,
// each mask/modifier and a combination, BSHD strides.
inline std::vector<Case> sweep(Path path) {
  std::vector<Case> cases;
  const auto add = [&](Case c) { cases.push_back(on_path(path, c)); };
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const bool half = dtype != DType::f32;
    Case c;
    c.dtype = dtype;
    c.grad_f32 = half;
    c.name = "gqa_113x203_d64";
    c.heads = 2, c.kv_heads = 1, c.seq_q = 113, c.seq_k = 203, c.head_dim = 64;
    add(c);
    c = Case{};
    c.dtype = dtype;
    c.name = "bottom_right_d7_lengths_dlse";
    c.batch = 2, c.heads = 2, c.kv_heads = 2, c.seq_q = 37, c.seq_k = 50, c.head_dim = 7;
    c.causal = Causal::bottom_right;
    c.key_lengths = {0, 29};
    c.dlse = true;  // rows without keys (batch 0, and the first rows of batch 1) take none of it
    add(c);
    c = Case{};
    c.dtype = dtype;
    c.name = "top_left_gqa4_d32_bshd";
    c.heads = 4, c.kv_heads = 1, c.seq_q = 70, c.seq_k = 64, c.head_dim = 32;
    c.causal = Causal::top_left;
    c.bshd = true;
    c.grad_f32 = half;
    add(c);
    c = Case{};
    c.dtype = dtype;
    c.name = "varlen_empty_sequences";
    c.heads = 2, c.kv_heads = 1, c.head_dim = 16;
    c.causal = Causal::bottom_right;
    c.varlen_q = {7, 0, 33, 1};
    c.varlen_k = {20, 5, 0, 9};
    add(c);
  }
  for (DType dtype : {DType::f32, DType::bf16}) {
    Case c;
    c.dtype = dtype;
    c.heads = 2, c.kv_heads = 2, c.seq_q = 33, c.seq_k = 45, c.head_dim = 24;
    Case w = c;
    w.name = "window";
    w.window_left = 6, w.window_right = 2;
    add(w);
    Case s = c;
    s.name = "softcap";
    s.softcap = 1.5f;
    add(s);
    Case a = c;
    a.name = "alibi_causal";
    a.alibi = true;
    a.causal = Causal::bottom_right;
    add(a);
    Case b = c;
    b.name = "bias";
    b.bias = true;
    add(b);
    b.name = "bias_bool_causal";
    b.bias_bool = true;
    b.causal = Causal::top_left;
    add(b);
    Case sinks = c;
    sinks.name = "sinks_gqa_lengths_dlse";  // batch 0 sees no key: its rows are the sinks' alone
    sinks.batch = 2, sinks.heads = 3, sinks.kv_heads = 1;
    sinks.key_lengths = {0, 40};
    sinks.causal = Causal::bottom_right;
    sinks.sinks = true;
    sinks.dlse = true;
    add(sinks);
    Case all = c;
    all.name = "everything_varlen_dlse";
    all.dlse = true;
    all.varlen_q = {20, 13};
    all.varlen_k = {31, 45};
    all.causal = Causal::top_left;
    all.window_left = 9;
    all.softcap = 3.0f;
    all.alibi = true;
    all.bias = true;
    all.sinks = true;
    all.grad_f32 = dtype != DType::f32;
    add(all);
    Case offsets = c;
    offsets.name = "key_start_q_offset_alibi_window_lengths";  // left padding and rows placed by q_offset
    offsets.batch = 3;
    offsets.causal = Causal::bottom_right;
    offsets.key_lengths = {45, 30, 45};
    offsets.key_start = {12, 0, 45};  // batch 2: the start at the length leaves no key
    offsets.q_offset = {0, 20, 3};
    offsets.window_left = 15;
    offsets.alibi = true;
    add(offsets);
    Case varlen_offsets = c;
    varlen_offsets.name = "key_start_q_offset_varlen";
    varlen_offsets.varlen_q = {9, 4};
    varlen_offsets.varlen_k = {40, 17};
    varlen_offsets.causal = Causal::top_left;
    varlen_offsets.key_start = {25, 2};
    varlen_offsets.q_offset = {5, 20};
    add(varlen_offsets);
    varlen_offsets.name = "key_lengths_varlen";  // seqused_k: each sequence uses its first keys
    varlen_offsets.key_lengths = {33, 9};
    add(varlen_offsets);
  }
  return cases;
}

// GPU-sized shapes for the naive and cublas paths (their *OnGpu suites): 300 x 1000 rows at head_dim
// 128 in bf16 with f32 gradients and key lengths, then 64 in f16 without; each rerun bitwise. Run
// with a small workspace, they are chunked by rows.
inline std::vector<Case> larger_shapes(Path path) {
  Case c;
  c.name = "larger";
  c.path = path;
  c.dtype = DType::bf16;
  c.grad_f32 = true;
  c.batch = 2, c.heads = 4, c.kv_heads = 2, c.seq_q = 300, c.seq_k = 1000, c.head_dim = 128;
  c.causal = Causal::bottom_right;
  c.key_lengths = {1000, 517};
  c.deterministic_rerun = true;
  Case f16 = c;
  f16.name = "larger_f16";
  f16.dtype = DType::f16;
  f16.grad_f32 = false;
  f16.causal = Causal::none;
  f16.key_lengths = {};
  f16.head_dim = 64;
  return {c, f16};
}

// What every path's dsinks and varlen metadata must survive: a head with more query rows than the
// sinks' gradient kernel has threads (`sink_threads`, SinkGradientTraits through the registry:
// rows past the first thread sweep, and past the second), and a varlen call whose views run past
// cu_seqlens (rows no sequence owns, NaN in every input there and in the LSE and dlse): dq, dk, dv
// must be 0 in those rows and dsinks must sum the owned rows alone.
inline std::vector<Case> sinks_and_tails(Path path, DType dtype, int head_dim, int sink_threads) {
  std::vector<Case> cases;
  Case c;
  c.path = path;
  c.dtype = dtype;
  c.head_dim = head_dim;
  c.name = std::string(to_string(path)) + "_sinks_rows_past_two_thread_sweeps";
  c.heads = 3, c.kv_heads = 1, c.seq_q = 2 * sink_threads + 1, c.seq_k = 9;
  c.causal = Causal::bottom_right;  // the first rows see no key: the sinks' alone
  c.sinks = true;
  c.dlse = true;
  cases.push_back(c);
  c = Case{};
  c.path = path;
  c.dtype = dtype;
  c.head_dim = head_dim;
  c.grad_f32 = dtype != DType::f32;
  c.name = std::string(to_string(path)) + "_varlen_unowned_rows_sinks";
  c.heads = 3, c.kv_heads = 1;
  c.varlen_q = {5, 0, sink_threads + 3};
  c.varlen_k = {7, 3, 20};
  c.unowned_q_rows = 7, c.unowned_k_rows = 5;
  c.causal = Causal::bottom_right;
  c.sinks = true;
  c.dlse = true;
  cases.push_back(c);
  return cases;
}

// The fused path's sweep (f16/bf16 and its head dims only), each case in both modes: dQ by atomics
// and the deterministic dQ kernel.
inline std::vector<Case> fused_sweep() {
  std::vector<Case> cases;
  const auto add = [&](Case c, const std::string& name) {
    c.path = Path::fused;
    for (bool deterministic : {false, true}) {
      c.deterministic = deterministic;
      c.name = std::string("fused_") + to_string(c.dtype) + (c.grad_f32 ? "_gradf32_" : "_") + name +
               (deterministic ? "_deterministic" : "_atomic");
      cases.push_back(c);
    }
  };
  Case c;
  c.dtype = DType::f16;
  c.heads = 2, c.kv_heads = 1, c.seq_q = 113, c.seq_k = 203, c.head_dim = 32;
  add(c, "gqa_113x203_d32");
  c = Case{};
  c.dtype = DType::bf16;
  c.batch = 2, c.heads = 2, c.kv_heads = 2, c.seq_q = 7, c.seq_k = 1, c.head_dim = 64;
  c.causal = Causal::bottom_right;  // rows 0-5 see no key
  c.grad_f32 = true;
  add(c, "7x1_d64_bottom_right");
  c = Case{};
  c.dtype = DType::f16;
  c.seq_q = 1, c.seq_k = 7, c.head_dim = 96;
  add(c, "1x7_d96");
  c = Case{};
  c.dtype = DType::bf16;
  c.heads = 4, c.kv_heads = 2, c.seq_q = 70, c.seq_k = 64, c.head_dim = 64;
  c.causal = Causal::top_left;
  c.bshd = true;
  add(c, "top_left_gqa_bshd_d64");
  c = Case{};
  c.dtype = DType::f16;
  c.batch = 2, c.heads = 2, c.kv_heads = 1, c.seq_q = 33, c.seq_k = 40, c.head_dim = 128;
  c.causal = Causal::bottom_right;
  c.key_lengths = {0, 29};
  c.dlse = true;
  add(c, "bottom_right_lengths_d128_dlse");
  c = Case{};
  c.dtype = DType::bf16;
  c.heads = 2, c.kv_heads = 1, c.head_dim = 64;
  c.causal = Causal::bottom_right;
  c.varlen_q = {7, 0, 33, 1};
  c.varlen_k = {20, 5, 0, 9};
  add(c, "varlen_empty_sequences");
  c = Case{};
  c.dtype = DType::f16;
  c.heads = 2, c.kv_heads = 2, c.head_dim = 32;
  c.varlen_q = {20, 45};
  c.varlen_k = {31, 45};
  c.causal = Causal::top_left;
  c.window_left = 9;
  c.softcap = 3.0f;
  c.alibi = true;
  c.bias = true;
  c.grad_f32 = true;
  c.dlse = true;
  c.sinks = true;
  add(c, "window_softcap_alibi_bias_sinks_varlen_dlse");
  c = Case{};
  c.dtype = DType::bf16;
  c.batch = 2, c.heads = 3, c.kv_heads = 1, c.seq_q = 40, c.seq_k = 70, c.head_dim = 64;
  c.causal = Causal::bottom_right;
  c.key_lengths = {0, 55};  // batch 0's rows hold only their sinks
  c.sinks = true;
  c.dlse = true;
  add(c, "sinks_gqa_lengths_d64_dlse");
  c = Case{};
  c.dtype = DType::f16;
  c.heads = 2, c.kv_heads = 1, c.seq_q = 40, c.seq_k = 70, c.head_dim = 64;
  c.causal = Causal::bottom_right;
  c.bias = c.bias_bool = true;  // a boolean mask, read as bytes
  add(c, "bias_bool_gqa_d64");
  c = Case{};
  c.dtype = DType::f16;
  c.batch = 3, c.heads = 2, c.kv_heads = 1, c.seq_q = 40, c.seq_k = 150, c.head_dim = 64;
  c.causal = Causal::bottom_right;
  c.key_lengths = {150, 120, 90};
  c.key_start = {70, 0, 89};  // past one key tile, none, one key left
  c.q_offset = {30, 60, 0};
  c.window_left = 50;
  c.grad_f32 = true;
  add(c, "key_start_q_offset_window_gqa_d64");
  c = Case{};
  c.dtype = DType::bf16;
  c.heads = 2, c.kv_heads = 2, c.head_dim = 128;
  c.varlen_q = {20, 3};
  c.varlen_k = {100, 64};
  c.causal = Causal::top_left;
  c.key_start = {65, 10};
  c.q_offset = {0, 50};
  add(c, "key_start_q_offset_varlen_d128");
  c.key_lengths = {90, 64};
  add(c, "key_lengths_key_start_varlen_d128");
  return cases;
}

}  // namespace selfattn::backward_check
