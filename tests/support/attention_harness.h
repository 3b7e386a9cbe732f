#pragma once
// The shared attention test harness. One AttentionCase describes a call; check_attention() makes
// fresh random inputs, uploads them in the case's dtype, poisons out and lse with NaN bytes, runs
// selfattn::attention, and compares with selfattn::reference fed the *rounded* inputs, so only the
// computation's own error is measured:
//   - every element of out (and lse) was written and none is NaN;
//   - ||out - ref|| / ||ref|| <= tolerance(dtype)   (ref all zero: out must be exactly zero);
//   - out is not all zeros when ref is not;
//   - lse: -inf exactly where the reference says a row sees no key, else within lse_tolerance.
//
//   TEST(Naive, Sweep) {
//     selfattn::Context ctx;
//     for (const auto& c : cases) EXPECT_TRUE(selfattn::testing::check_attention(ctx, c)) << c.name();
//   }
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "score_mods_case.h"
#include "selfattn/selfattn.h"

namespace selfattn {
// gtest prints parameters through PrintTo found by ADL: show a path by its name.
inline void PrintTo(Path path, std::ostream* os) { *os << to_string(path); }
}  // namespace selfattn

namespace selfattn::testing {

// Where heads sit in memory: [b, h, s, d] contiguous, or [b, s, h, d] (a projection's output).
enum class Layout : uint8_t { bhsd, bshd };
const char* to_string(Layout layout);

struct AttentionCase {
  DType dtype = DType::f32;
  int batch = 1, heads = 1, kv_heads = 1, seq_q = 1, seq_k = 1, head_dim = 1;
  Causal causal = Causal::none;
  std::vector<int32_t> key_lengths;  // empty: no key_lengths argument; else [batch]
  Layout layout = Layout::bhsd;
  bool with_lse = false;
  Path path = Path::automatic;
  std::optional<float> scale;  // unset: the library's default 1/sqrt(head_dim)
  // Extra elements between consecutive batches of q, k, v and out (their batch stride grows by it).
  // 2^31 puts batch 1 past 32-bit element offsets; only the dense blocks are ever touched.
  int64_t batch_gap = 0;
  // Unused elements after every row (one head's head_dim values) of q, k, v and out, so the sequence
  // stride exceeds the dense one, as in a slice of a packed QKV projection. The harness checks that
  // out's gaps stay untouched.
  int64_t row_gap = 0;
  // Sliding window, softcap, ALiBi, bias (score_mods_case.h); default none.
  ScoreModsCase mods;

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

// A context on the cuda backend, or nullopt with `reason` set (for GTEST_SKIP) where no GPU is usable.
std::optional<Context> cuda_context(std::string& reason, size_t workspace_limit = size_t(1) << 30);

// Tolerated relative error of out by dtype: f32 1e-5, f16 2e-3, bf16 1e-2.
double tolerance(DType dtype);
// Tolerated |lse - ref| / max(1, |ref|): LSE comes from fp32 scores in every path.
double lse_tolerance(DType dtype);

// The seed of a case's random inputs: a hash of its name mixed with SELFATTN_SIM_SEED (so the two
// seeded runs of a sim test also see different inputs).
uint64_t input_seed(const AttentionCase& c);

struct Measured {
  double out_rel_error = 0;  // ||out - ref|| / ||ref|| (or ||out|| when ref is all zero)
  double lse_max_error = 0;  // max over finite rows of |lse - ref| / max(1, |ref|)
};

// Runs the case on ctx and checks it; the failure message says what was wrong and where.
// `measured`, when given, receives the errors (for reports and tolerance studies).
::testing::AssertionResult check_attention(Context& ctx, const AttentionCase& c, Measured* measured = nullptr);

// A variable-length batch (attention_varlen): sequence b has seq_q[b] queries and seq_k[b] keys,
// packed without padding into q/out [1, heads, total_q, head_dim] and k/v [1, kv_heads, total_k,
// head_dim] in the layout (bshd: the usual packed [total, heads, head_dim]).
struct VarlenCase {
  DType dtype = DType::f32;
  int heads = 1, kv_heads = 1, head_dim = 1;
  std::vector<int> seq_q, seq_k;  // one entry per sequence; zeros allowed
  Causal causal = Causal::none;
  Layout layout = Layout::bshd;
  bool with_lse = false;
  Path path = Path::automatic;
  std::string name() const;
};

// As check_attention, each sequence compared with the reference run on that sequence alone; LSE
// is [heads, total_q].
::testing::AssertionResult check_attention_varlen(Context& ctx, const VarlenCase& c, Measured* measured = nullptr);
// The same with masks and score modifiers; the bias is [sequences, heads, max_q, max_k].
::testing::AssertionResult check_attention_varlen(Context& ctx, const VarlenCase& c, const ScoreModsCase& mods,
                                                  Measured* measured = nullptr);

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

}  // namespace selfattn::testing
