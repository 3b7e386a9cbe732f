#pragma once
// One case of the backward check (backward_check.h): the call's shape, dtypes, masks and modifiers,
// layout and path, and the gradients read back.
#include <cstdint>
#include <string>
#include <vector>

#include "attention_harness.h"
#include "selfattn/selfattn.h"

namespace selfattn::backward_check {

struct Case {
  std::string name;
  DType dtype = DType::f32;
  bool grad_f32 = false;  // gradients in f32 (else in the input dtype)
  int batch = 1, heads = 1, kv_heads = 1, seq_q = 1, seq_k = 1, head_dim = 1;
  int head_dim_v = 0;  // v's, out's, dout's and dv's head dim where it is not head_dim (q's, k's); 0: head_dim
  int v_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  Causal causal = Causal::none;
  std::vector<int32_t> key_lengths;  // [batch] (varlen: one per sequence, seqused_k) or empty
  // [batch] (varlen: one per sequence) or empty: AttentionOptions::key_start, q_offset.
  std::vector<int32_t> key_start = {}, q_offset = {};
  int window_left = -1, window_right = -1;
  float softcap = 0;
  bool alibi = false;        // [heads] slopes
  bool bias = false;         // dense fp32 [batch, heads, seq_q, seq_k], ~10% -inf and one fully masked row
  bool bias_bool = false;    // with bias: the same mask as booleans (DType::b8), every other entry 0
  bool bshd = false;         // q in BSHD (else BHSD); the others as `strides` says
  // distinct: each tensor its own layout and row gap, derived from q's (testing::tensor_layout);
  // shared: all in q's layout with row_gap (the layout every tensor shared before).
  testing::Strides strides = testing::Strides::distinct;
  int row_gap = 0;
  std::vector<int> varlen_q, varlen_k;  // non-empty: a varlen call with these lengths (batch = size)
  // varlen: rows past the last sequence that no sequence owns (cu_seqlens ends before the views do,
  // as in a batch padded to a bucket size). They hold NaN in q, k, v, out, dout, the LSE and dlse;
  // dq, dk, dv must be 0 there (backward.h) and dsinks must not take them in.
  int unowned_q_rows = 0, unowned_k_rows = 0;
  Path path = Path::naive;
  bool deterministic = false;        // BackwardOptions::deterministic
  bool deterministic_rerun = false;  // run the backward twice, require bitwise-equal gradients
  bool dlse = false;                 // an upstream gradient of the LSE too (BackwardOptions::dlse)
  // Attention sinks ([heads] logits near log(seq_k), every third head -inf) and their gradient
  // (BackwardOptions::dsinks).
  bool sinks = false;
  // Dropout (AttentionOptions::dropout_p, seed, offset) in the forward and the backward; the
  // reference takes the library's mask (reference::dropout_keep_mask; varlen: per sequence).
  float dropout_p = 0;
  uint64_t dropout_seed = 0, dropout_offset = 0;
};

struct Gradients {
  std::vector<float> dq, dk, dv;  // logical BHSD ([1, h, total, d] for varlen), as stored then widened
  std::vector<float> dsinks;      // [heads] with sinks
};

}  // namespace selfattn::backward_check
