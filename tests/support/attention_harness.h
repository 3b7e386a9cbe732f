#pragma once
// The shared attention test harness. One AttentionCase describes a call; check_attention() makes
// fresh random inputs, uploads them in the case's dtype (each tensor in its own layout with its own
// row gaps, NaN in the gaps of inputs: tensor_layouts.h), poisons out and lse with NaN bytes, runs
// selfattn::attention, and judges out and lse by the rule in judge.h against selfattn::reference
// fed the *rounded* inputs (so only the computation's own error is measured) and a second
// computation done the way the path is allowed to (attention_expected.h):
//   - every element of out (and lse) was written and none is NaN or inf;
//   - out and lse within 2x the allowed computation's error (+ a floor) at every element, in every
//     row, and overall; exactly 0 / -inf where a row sees no key;
//   - out's row gaps are never written.
//
//   TEST(Naive, Sweep) {
//     selfattn::Context ctx;
//     for (const auto& c : cases) EXPECT_TRUE(selfattn::testing::check_attention(ctx, c)) << c.name();
//   }
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "score_mods_case.h"
#include "attention_expected.h"
#include "judge.h"
#include "tensor_layouts.h"
#include "selfattn/selfattn.h"

namespace selfattn {
// gtest prints parameters through PrintTo found by ADL: show a path by its name.
inline void PrintTo(Path path, std::ostream* os) { *os << to_string(path); }
}  // namespace selfattn

namespace selfattn::testing {

// How K is drawn. random: every element from N(0, 1). rising: each (batch, kv head) draws one row
// k0 and key j is k0 (1 + kRisingKeyStep j), so the scores x_j = x_0 (1 + kRisingKeyStep j) of
// every query with x_0 > 0 (half of them) rise slowly along the row: the online softmax's running
// maximum grows by a sliver at each key tile and its rescale factor sits just below 1 - which
// random keys almost never do (a skipped or wrong rescale near 1 is invisible with them).
enum class Keys : uint8_t { random, rising };
// A 64-key tile raises x by 6.4e-4 x: the rescale factor exp(-6.4e-4 x) stays above 0.999 for
// x < 1.5, most of the rising rows.
constexpr double kRisingKeyStep = 1e-5;

struct AttentionCase {
  DType dtype = DType::f32;
  int batch = 1, heads = 1, kv_heads = 1, seq_q = 1, seq_k = 1, head_dim = 1;
  int head_dim_v = 0;  // v's and out's head dim where it is not head_dim (q's and k's); 0: head_dim
  int v_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  Causal causal = Causal::none;
  std::vector<int32_t> key_lengths;  // empty: no key_lengths argument; else [batch]
  // Empty: no argument; else [batch] (AttentionOptions::key_start, q_offset). K/V rows before a
  // key_start are NaN on the device, as rows past a key length are.
  std::vector<int32_t> key_start = {}, q_offset = {};
  // q's layout; with Strides::distinct (the default) k, v and out each get their own, derived from
  // it and row_gap (tensor_layout in tensor_layouts.h); with Strides::shared all four take it.
  Layout layout = Layout::bhsd;
  Strides strides = Strides::distinct;
  bool with_lse = false;
  Path path = Path::automatic;
  std::optional<float> scale;  // unset: the library's default 1/sqrt(head_dim)
  // Extra elements between consecutive batches of q, k, v and out (their batch stride grows by it).
  // 2^31 puts batch 1 past 32-bit element offsets; only the dense blocks are ever touched.
  int64_t batch_gap = 0;
  // Unused elements after every row (one head's head_dim values) of q (and, as tensor_layout says,
  // more after those of k, v and out), so the sequence stride exceeds the dense one, as in a slice
  // of a packed QKV projection. The harness checks that out's gaps stay untouched.
  int64_t row_gap = 0;
  // Sliding window, softcap, ALiBi, bias (score_mods_case.h); default none.
  ScoreModsCase mods;
  // Elements by which every tensor's data pointer is shifted from its allocation (1: rows no longer
  // start on 16 bytes).
  int misalign = 0;
  Keys keys = Keys::random;
  // FP8 inputs (AttentionOptions::q_descale): q, k and v stored in this format, each with a descale
  // per (batch, kv head) from fp8_descale(); dtype is then out's (and the allowed computation's).
  std::optional<DType> fp8;

  // "f16 b2 h4/2 q113 k64 d32 causal=top_left keys=[0,64] bshd lse naive": names a failing case.
  std::string name() const;
};

// Shorthand for a case (path last; the harness's sweeps are built from it).
AttentionCase make_case(DType dtype, int batch, int heads, int kv_heads, int seq_q, int seq_k, int head_dim,
                        Causal causal = Causal::none, Layout layout = Layout::bhsd, bool with_lse = false,
                        std::vector<int32_t> key_lengths = {}, Path path = Path::automatic);

// A chosen list of cases for one dtype that together cover every value of each axis: batch 1-3,
// heads 1-8 with kv_heads dividing them, seq_q/seq_k from {1, 2, 7, 64, 113, 203, 257} in unequal
// pairs, head_dim from {1, 2, 7, 32, 64, 80, 128}, the three causal modes, key lengths with 0 and
// full, BSHD and BHSD, with and without LSE. Cases whose head_dim fails `head_dim_ok` are dropped
// (for paths that take only some head dims).
std::vector<AttentionCase> sweep_cases(DType dtype, Path path, bool (*head_dim_ok)(int) = nullptr);

// Runs every case on ctx; each failure is reported as a gtest failure naming the case.
// SELFATTN_TEST_REPORT=1 in the environment prints every case's measured errors.
void expect_all_pass(Context& ctx, const std::vector<AttentionCase>& cases);

// The seed of a test's random inputs: a hash of its name mixed with SELFATTN_SIM_SEED (so the two
// seeded runs of a sim test also see different inputs, and SELFATTN_SIM_SEED=3, 4, ... fresh ones).
uint64_t input_seed(const std::string& name);
inline uint64_t input_seed(const AttentionCase& c) { return input_seed(c.name()); }

// Whether the kernel that runs this call rounds P to the input dtype before P V (a tensor-core P V
// takes A and B of one type): cublas for f16/bf16; naive where its P V kernel is the tensor-core
// one; fused where the tensor-core kernel runs (a shipped head dim, every row on 16 bytes). It
// follows the choices of host/src/path_*.cpp and the registry; the allowed computation follows it.
bool rounds_probabilities(Context& ctx, Path path, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& out, const AttentionOptions& options);

// Whether the Hopper FP8 kernel runs this FP8 call as it is (host/src/forward/fused_hopper_fp8.cpp,
// fused_takes_fp8: e4m3, head_dim 128 or 256, f16/bf16 out, rows on 16 bytes, not varlen, no
// key_start or dropout, Hopper kernels in use), rounding P to e4m3 for P V.
bool hopper_fp8_kernel_runs(Context& ctx, Path path, const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const AttentionOptions& options, bool varlen);

// Sets arithmetic.p_rounded and p_fp8 as the kernel that runs the call rounds P: rounds_probabilities()
// for 16- and 32-bit inputs; for FP8 inputs e4m3 on the Hopper FP8 kernel, else what
// rounds_probabilities() says of the call on q, k and v dequantized into out's dtype (the library's
// contiguous copies in its workspace: fp8_inputs.cpp).
void set_probability_rounding(Context& ctx, Path path, const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const AttentionOptions& options, AttentionArithmetic& arithmetic,
                              bool varlen = false);

// How close a case came to its bounds (judge.h): ratios <= 1 pass.
struct Measured {
  Judgement out, lse;
};
// One line per case for SELFATTN_TEST_REPORT=1: out's error / bound at each level (element, row,
// overall) and the allowed computation's worst errors, then the same for lse.
void print_report(const std::string& name, const Measured& measured);

// Runs the case on ctx and checks it; the failure message says what was wrong and where.
// `measured`, when given, receives the errors (for reports and tolerance studies).
::testing::AssertionResult check_attention(Context& ctx, const AttentionCase& c, Measured* measured = nullptr);

// attention_backward() with NaN in every K and V row past the key lengths (as check_attention
// poisons them: an unused cache's rows), against the same call with those rows finite, for a few
// cases on `path` (GQA, both layouts, every causal mode, gradients in the input dtype and f32, key
// lengths full, partial, 0; left padding: key_start, with and without q_offset): the padding is
// no input of the gradients, so both give the same dq,
// dk and dv - within `tolerance` x the largest |element| of that gradient (0: equal, as on the sim)
// - all finite, and dk/dv rows past the key lengths exactly 0. out and the LSE come from the
// finite inputs.
::testing::AssertionResult check_backward_ignores_key_padding(Context& ctx, Path path, double tolerance = 0);

// A variable-length batch (attention_varlen): sequence b has seq_q[b] queries and seq_k[b] keys,
// packed without padding into q/out [1, heads, total_q, head_dim] and k/v [1, kv_heads, total_k,
// head_dim] in the layout (bshd: the usual packed [total, heads, head_dim]; each tensor its own as
// AttentionCase::strides says), then unowned_q_rows / unowned_k_rows more rows that no sequence owns
// (cu_seqlens ends before the views do, as in a batch padded to a bucket size): NaN in q, k and v,
// and out and lse there must stay unwritten (attention.h).
struct VarlenCase {
  DType dtype = DType::f32;
  int heads = 1, kv_heads = 1, head_dim = 1;
  std::vector<int> seq_q, seq_k;  // one entry per sequence; zeros allowed
  Causal causal = Causal::none;
  Layout layout = Layout::bshd;
  bool with_lse = false;
  Path path = Path::automatic;
  int misalign = 0;  // as AttentionCase::misalign
  Strides strides = Strides::distinct;
  int unowned_q_rows = 0, unowned_k_rows = 0;
  // Empty, or one entry per sequence (AttentionOptions::key_start, q_offset, counted within it).
  std::vector<int32_t> key_start = {}, q_offset = {};
  // Empty, or one entry per sequence: the keys it uses (options.key_lengths, FlashAttention's
  // seqused_k); its key rows past them hold NaN, as rows before a key_start do.
  std::vector<int32_t> key_lengths = {};
  std::optional<DType> fp8;  // as AttentionCase::fp8, the descales per (sequence, kv head)
  int head_dim_v = 0;        // as AttentionCase::head_dim_v (last: the tests list cases by position)
  int v_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  std::string name() const;
};

// As check_attention, each sequence compared with the reference run on that sequence alone; LSE
// is [heads, total_q].
::testing::AssertionResult check_attention_varlen(Context& ctx, const VarlenCase& c, Measured* measured = nullptr);
// The same with masks and score modifiers; the bias is [sequences, heads, max_q, max_k].
::testing::AssertionResult check_attention_varlen(Context& ctx, const VarlenCase& c, const ScoreModsCase& mods,
                                                  Measured* measured = nullptr);

// The descale of FP8 input `role` (q, k or v) of batch (varlen: sequence) b and kv head g, the
// real value being stored x descale: one of 0.375, 0.625, 0.75, 1.25, 2.5, varying along b, g and
// role. Two or three significant bits, so a stored e4m3/e5m2 value times one is exact in f16 and
// bf16: every path's dequantized inputs are the reference's exactly.
double fp8_descale(Role role, int b, int g);

// Host conversions used to round inputs to the device dtype (round to nearest even).
uint16_t float_to_half_bits(float x);
uint16_t float_to_bf16_bits(float x);
float half_bits_to_float(uint16_t bits);
float bf16_bits_to_float(uint16_t bits);
// Stores value (already representable) into an element of `dtype` at bytes[index].
void store_element(void* bytes, DType dtype, size_t index, float value);
float load_element(const void* bytes, DType dtype, size_t index);
// The value the device sees when `value` is stored in `dtype`.
float round_to(DType dtype, float value);
// `count` standard-normal values already representable in `dtype`, on the device (`label` names
// the buffer in errors).
DeviceBuffer<unsigned char> random_device_values(Context& ctx, DType dtype, size_t count, std::mt19937_64& rng,
                                                 const char* label);

}  // namespace selfattn::testing
