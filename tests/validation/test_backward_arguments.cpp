// attention_backward()'s own bad inputs (dout, lse, the gradients, options.lse, overlaps) get an
// InvalidArgument naming the argument, and a call that throws leaves dq, dk and dv byte for byte as
// they were; the zero-size calls (no query rows, no keys) zero-fill the gradients backward.h says.
// Sim backend; nothing here asserts which paths exist, and none of these calls reaches one.
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "selfattn/selfattn.h"
#include "test_helpers.h"

namespace selfattn {
namespace {

using host_test::throws_with;

// What the gradients are filled with before a call: not a value any path would write by accident
// (0xFFFF... is a NaN in f32, f16 and bf16).
constexpr unsigned char kGradientFill = 0xFF;

// Every byte of the buffer still holds `byte`.
template <class T>
::testing::AssertionResult all_bytes(const DeviceBuffer<T>& buffer, unsigned char byte) {
  const std::vector<T> host = buffer.to_host();
  const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
  for (size_t i = 0; i < host.size() * sizeof(T); ++i) {
    if (bytes[i] != byte) {
      return ::testing::AssertionFailure() << "byte " << i << " of " << host.size() * sizeof(T) << " is "
                                           << int(bytes[i]) << ", expected " << int(byte);
    }
  }
  return ::testing::AssertionSuccess();
}

// Every element is +0.0f (bitwise: -0 or NaN fail).
::testing::AssertionResult all_zero(const DeviceBuffer<float>& buffer) { return all_bytes(buffer, 0); }

// A valid GQA backward call in `dtype`: q/out/dout/dq [2, 4, 5, 3], k/v/dk/dv [2, 2, 7, 3], lse
// [2, 4, 5]; each test breaks one argument. Buffers are float-sized per element whatever the dtype
// (a 2-byte view uses the first half), so overlaps are set up the same way for every dtype.
struct BackwardCallFixture {
  static constexpr int64_t kBatch = 2, kHeads = 4, kKvHeads = 2, kSeqQ = 5, kSeqK = 7, kDim = 3;
  static constexpr size_t kQElems = kBatch * kHeads * kSeqQ * kDim;    // 120
  static constexpr size_t kKElems = kBatch * kKvHeads * kSeqK * kDim;  // 84
  static constexpr size_t kRows = kBatch * kHeads * kSeqQ;             // 40

  explicit BackwardCallFixture(DType dtype = DType::f32, unsigned seed = 1) : dtype(dtype) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    // Random bytes are fine for the 2-byte dtypes too: no call here computes with them.
    for (auto* buffer : {&q_mem, &k_mem, &v_mem, &out_mem, &dout_mem}) {
      std::vector<float> host(buffer->size());
      for (float& x : host) x = uniform(rng);
      buffer->copy_from_host(host);
    }
    std::vector<float> lse(lse_mem.size());
    for (float& x : lse) x = 1.0f + uniform(rng);
    lse_mem.copy_from_host(lse);
    for (auto* buffer : {&dq_mem, &dk_mem, &dv_mem}) buffer->fill_bytes(kGradientFill);
  }

  void run() { attention_backward(ctx, q, k, v, out, dout, lse, dq, dk, dv, options, backward); }

  // dq, dk and dv hold exactly the bytes they held before the call.
  ::testing::AssertionResult gradients_untouched() const {
    for (const auto* buffer : {&dq_mem, &dk_mem, &dv_mem}) {
      ::testing::AssertionResult result = all_bytes(*buffer, kGradientFill);
      if (!result) return result << (buffer == &dq_mem ? " (dq)" : buffer == &dk_mem ? " (dk)" : " (dv)");
    }
    return ::testing::AssertionSuccess();
  }

  TensorView q_like(float* data) const { return TensorView::bhsd(data, dtype, kBatch, kHeads, kSeqQ, kDim); }
  TensorView k_like(float* data) const { return TensorView::bhsd(data, dtype, kBatch, kKvHeads, kSeqK, kDim); }

  DType dtype;
  Context ctx{Backend::sim};
  DeviceBuffer<float> q_mem{ctx, kQElems}, k_mem{ctx, kKElems}, v_mem{ctx, kKElems};
  DeviceBuffer<float> out_mem{ctx, kQElems}, dout_mem{ctx, kQElems}, lse_mem{ctx, kRows};
  DeviceBuffer<float> dq_mem{ctx, kQElems}, dk_mem{ctx, kKElems}, dv_mem{ctx, kKElems};
  TensorView q = q_like(q_mem.data());
  TensorView k = k_like(k_mem.data());
  TensorView v = k_like(v_mem.data());
  TensorView out = q_like(out_mem.data());
  TensorView dout = q_like(dout_mem.data());
  const float* lse = lse_mem.data();
  TensorView dq = q_like(dq_mem.data());
  TensorView dk = k_like(dk_mem.data());
  TensorView dv = k_like(dv_mem.data());
  AttentionOptions options;
  BackwardOptions backward;
};

// A bad argument: InvalidArgument from attention_backward whose message contains `parts`, and the
// gradients untouched.
#define EXPECT_REJECTED(call, ...)                                                                            \
  do {                                                                                                        \
    EXPECT_TRUE(throws_with<InvalidArgument>([&] { (call).run(); }, {"attention_backward", __VA_ARGS__})); \
    EXPECT_TRUE((call).gradients_untouched());                                                                \
  } while (0)

TEST(BackwardArguments, DoutShape) {
  { BackwardCallFixture c; c.dout.shape[2] = 4; EXPECT_REJECTED(c, "dout.shape[2] (seq) expected 5", "got 4"); }
  { BackwardCallFixture c; c.dout.shape[3] = 2; EXPECT_REJECTED(c, "dout.shape[3] (head_dim) expected 3", "got 2"); }
  { BackwardCallFixture c; c.dout.shape[1] = 2; EXPECT_REJECTED(c, "dout.shape[1] (heads) expected 4", "got 2"); }
}

TEST(BackwardArguments, DoutDtype) {
  { BackwardCallFixture c; c.dout.dtype = DType::f16; EXPECT_REJECTED(c, "dout.dtype expected f32", "got f16"); }
  {
    BackwardCallFixture c(DType::bf16);
    c.dout.dtype = DType::f32;  // f32 is allowed for the gradients, not for dout
    EXPECT_REJECTED(c, "dout.dtype expected bf16", "got f32");
  }
}

TEST(BackwardArguments, GradientShapes) {
  { BackwardCallFixture c; c.dq.shape[2] = 6; EXPECT_REJECTED(c, "dq.shape[2] (seq) expected 5", "got 6"); }
  { BackwardCallFixture c; c.dq.shape[0] = 1; EXPECT_REJECTED(c, "dq.shape[0] (batch) expected 2", "got 1"); }
  // dk/dv follow k (kv_heads = 2), not q (heads = 4).
  { BackwardCallFixture c; c.dk.shape[1] = 4; EXPECT_REJECTED(c, "dk.shape[1] (heads) expected 2", "got 4"); }
  { BackwardCallFixture c; c.dk.shape[2] = 5; EXPECT_REJECTED(c, "dk.shape[2] (seq) expected 7", "got 5"); }
  { BackwardCallFixture c; c.dv.shape[3] = 4; EXPECT_REJECTED(c, "dv.shape[3] (head_dim) expected 3", "got 4"); }
  { BackwardCallFixture c; c.dv.shape[2] = 8; EXPECT_REJECTED(c, "dv.shape[2] (seq) expected 7", "got 8"); }
}

// Gradients are in q's dtype or f32: an f16 gradient for bf16 inputs is a third dtype.
TEST(BackwardArguments, GradientInAThirdDtype) {
  { BackwardCallFixture c(DType::bf16); c.dq.dtype = DType::f16; EXPECT_REJECTED(c, "dq.dtype expected bf16", "f32", "got f16"); }
  { BackwardCallFixture c(DType::bf16); c.dk.dtype = DType::f16; EXPECT_REJECTED(c, "dk.dtype expected bf16", "got f16"); }
  { BackwardCallFixture c(DType::f16); c.dv.dtype = DType::bf16; EXPECT_REJECTED(c, "dv.dtype expected f16", "got bf16"); }
  { BackwardCallFixture c; c.dq.dtype = DType::bf16; EXPECT_REJECTED(c, "dq.dtype expected f32", "got bf16"); }
}

TEST(BackwardArguments, OptionsLseMustBeNull) {
  BackwardCallFixture c;
  c.options.lse = c.lse_mem.data();
  EXPECT_REJECTED(c, "options.lse expected null");
}

// The forward's options are validated again: a dropout rate outside [0, 1) is refused by name.
TEST(BackwardArguments, DropoutRate) {
  {
    BackwardCallFixture c;
    c.options.dropout_p = 1.0f;
    EXPECT_REJECTED(c, "options.dropout_p expected", "[0, 1)");
  }
  {
    BackwardCallFixture c;
    c.options.dropout_p = -0.5f;
    EXPECT_REJECTED(c, "options.dropout_p expected", "[0, 1)");
  }
}

TEST(BackwardArguments, LseRequiredWhenThereAreRows) {
  BackwardCallFixture c;
  c.lse = nullptr;
  EXPECT_REJECTED(c, "lse expected the forward's LSE", "got null");
}

TEST(BackwardArguments, DlseMustNotOverlapAGradientAndMustBeAligned) {
  BackwardCallFixture c;
  c.backward.dlse = static_cast<const float*>(c.dq.data);
  EXPECT_REJECTED(c, "dq expected not to overlap backward.dlse");
  c.backward.dlse = reinterpret_cast<const float*>(reinterpret_cast<const char*>(c.lse_mem.data()) + 2);
  EXPECT_REJECTED(c, "backward.dlse expected 4-byte alignment");
}

TEST(BackwardArguments, DsinksNeedSinksAndAPlaceOfTheirOwn) {
  {
    BackwardCallFixture c;
    DeviceBuffer<float> dsinks(c.ctx, BackwardCallFixture::kHeads);
    c.backward.dsinks = dsinks.data();
    EXPECT_REJECTED(c, "backward.dsinks expected null without options.sinks");
  }
  BackwardCallFixture c;
  DeviceBuffer<float> sinks(c.ctx, BackwardCallFixture::kHeads), dsinks(c.ctx, BackwardCallFixture::kHeads + 1);
  c.options.sinks = sinks.data();
  c.backward.dsinks = sinks.data();
  EXPECT_REJECTED(c, "backward.dsinks expected not to overlap options.sinks");
  c.backward.dsinks = c.dq_mem.data() + 5;
  EXPECT_REJECTED(c, "dq expected not to overlap backward.dsinks");
  c.backward.dsinks = reinterpret_cast<float*>(reinterpret_cast<char*>(dsinks.data()) + 2);
  EXPECT_REJECTED(c, "backward.dsinks expected 4-byte alignment");
  c.backward.dsinks = dsinks.data();
  c.options.sinks = c.dq_mem.data();
  EXPECT_REJECTED(c, "dq expected not to overlap options.sinks");
}

TEST(BackwardArguments, GradientElementsNeedAddressesOfTheirOwn) {
  { BackwardCallFixture c; c.dq.strides[2] = 0; EXPECT_REJECTED(c, "dq.strides[2] (seq) = 0 makes elements of dq share addresses"); }
  { BackwardCallFixture c; c.dv.strides[0] = 0; EXPECT_REJECTED(c, "dv.strides[0] (batch) = 0 makes elements of dv share addresses"); }
}

TEST(BackwardArguments, GradientOverlaps) {
  { BackwardCallFixture c; c.dq.data = c.q_mem.data(); EXPECT_REJECTED(c, "dq expected not to overlap q"); }
  {
    // dk's last element is dv's first: one element of overlap is enough.
    BackwardCallFixture c;
    DeviceBuffer<float> both(c.ctx, 2 * BackwardCallFixture::kKElems);
    both.fill_bytes(kGradientFill);
    c.dk = c.k_like(both.data());
    c.dv = c.k_like(both.data() + BackwardCallFixture::kKElems - 1);
    EXPECT_TRUE(throws_with<InvalidArgument>([&] { c.run(); }, {"attention_backward", "dk expected not to overlap dv"}));
    EXPECT_TRUE(all_bytes(both, kGradientFill));
    EXPECT_TRUE(c.gradients_untouched());
  }
  {
    // dv inside dout's bytes (dout has 120 elements, dv 84).
    BackwardCallFixture c;
    c.dv.data = c.dout_mem.data() + 10;
    EXPECT_REJECTED(c, "dv expected not to overlap dout");
  }
  {
    // dq starts at lse's last entry.
    BackwardCallFixture c;
    DeviceBuffer<float> shared(c.ctx, BackwardCallFixture::kRows + BackwardCallFixture::kQElems);
    shared.fill_bytes(kGradientFill);
    c.lse = shared.data();
    c.dq = c.q_like(shared.data() + BackwardCallFixture::kRows - 1);
    EXPECT_TRUE(throws_with<InvalidArgument>([&] { c.run(); }, {"attention_backward", "dq expected not to overlap lse"}));
    EXPECT_TRUE(all_bytes(shared, kGradientFill));
    EXPECT_TRUE(c.gradients_untouched());
  }
  {
    // Not overlapping: one buffer split exactly between lse and dq passes validation. No keys, so
    // the call ends in the zero fill of dq (no path runs): dq's elements become 0 and lse's bytes,
    // right before dq, are not written.
    BackwardCallFixture c;
    c.k.shape[2] = c.v.shape[2] = c.dk.shape[2] = c.dv.shape[2] = 0;
    DeviceBuffer<float> shared(c.ctx, BackwardCallFixture::kRows + BackwardCallFixture::kQElems);
    shared.fill_bytes(kGradientFill);
    c.lse = shared.data();
    c.dq = c.q_like(shared.data() + BackwardCallFixture::kRows);
    c.run();
    const std::vector<float> host = shared.to_host();
    const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
    for (size_t i = 0; i < host.size() * sizeof(float); ++i) {
      ASSERT_EQ(bytes[i], i < BackwardCallFixture::kRows * sizeof(float) ? kGradientFill : 0) << "byte " << i;
    }
  }
}

// Every check runs before anything is written: a call that throws, wherever in validation or
// planning it fails, leaves the gradients' bytes as they were (0xFF here).
TEST(BackwardArguments, NothingWrittenOnAThrow) {
  {
    // The last check validation makes (an overlap of the last gradient pair).
    BackwardCallFixture c;
    c.dv.data = c.dout_mem.data();
    EXPECT_THROW(c.run(), InvalidArgument);
    EXPECT_TRUE(c.gradients_untouched());
  }
  {
    // A valid call with no workspace at all: D alone needs 256 bytes, so planning or reserving
    // throws (WorkspaceTooSmall, or NotAvailable where no path supports the call) before a write.
    BackwardCallFixture c;
    c.ctx.set_workspace_limit(0);
    EXPECT_THROW(c.run(), Error);
    EXPECT_TRUE(c.gradients_untouched());
  }
  {
    // An explicit path that is unknown to the backend: an error of some kind, nothing written.
    BackwardCallFixture c;
    c.options.path = Path(99);
    EXPECT_THROW(c.run(), Error);
    EXPECT_TRUE(c.gradients_untouched());
  }
}

// No query rows: dK = dV = 0 (every element of their views), dq has no elements (its bytes stay),
// and lse may be null. No path runs, so this holds on every backend and build.
TEST(BackwardZeroSizes, NoQueryRowsZeroFillsDkAndDv) {
  for (bool with_lse : {false, true}) {
    for (bool interleaved : {false, true}) {
      BackwardCallFixture c(DType::f32, 7 + with_lse + 2 * interleaved);
      c.q.shape[2] = c.out.shape[2] = c.dout.shape[2] = c.dq.shape[2] = 0;
      if (!with_lse) c.lse = nullptr;
      if (interleaved) {  // [batch, seq, heads, dim]: the zero fill must follow the strides
        c.dk = TensorView::bshd(c.dk_mem.data(), DType::f32, 2, 2, 7, 3);
        c.dv = TensorView::bshd(c.dv_mem.data(), DType::f32, 2, 2, 7, 3);
      }
      c.run();
      EXPECT_TRUE(all_zero(c.dk_mem)) << with_lse << interleaved;
      EXPECT_TRUE(all_zero(c.dv_mem)) << with_lse << interleaved;
      EXPECT_TRUE(all_bytes(c.dq_mem, kGradientFill)) << "dq has no elements";
    }
  }
  // batch = 0: every view is empty; nothing to write, null lse fine.
  BackwardCallFixture c;
  for (TensorView* view : {&c.q, &c.k, &c.v, &c.out, &c.dout, &c.dq, &c.dk, &c.dv}) view->shape[0] = 0;
  c.lse = nullptr;
  c.run();
  EXPECT_TRUE(c.gradients_untouched());
}

// No keys: dQ = 0 over its view, dk/dv have no elements (their bytes stay), lse may be null.
TEST(BackwardZeroSizes, NoKeysZeroFillsDq) {
  for (bool with_lse : {false, true}) {
    BackwardCallFixture c(DType::f32, 11 + with_lse);
    c.k.shape[2] = c.v.shape[2] = c.dk.shape[2] = c.dv.shape[2] = 0;
    if (!with_lse) c.lse = nullptr;
    c.run();
    EXPECT_TRUE(all_zero(c.dq_mem)) << with_lse;
    EXPECT_TRUE(all_bytes(c.dk_mem, kGradientFill)) << "dk has no elements";
    EXPECT_TRUE(all_bytes(c.dv_mem, kGradientFill)) << "dv has no elements";
  }
  {
    // bf16 inputs, dq in bf16: the view's 2-byte elements are zero (the first half of the buffer),
    // the rest of the buffer is not dq's and stays.
    BackwardCallFixture c(DType::bf16, 13);
    c.k.shape[2] = c.v.shape[2] = c.dk.shape[2] = c.dv.shape[2] = 0;
    c.run();
    const std::vector<float> host = c.dq_mem.to_host();
    const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
    const size_t view_bytes = BackwardCallFixture::kQElems * 2;
    for (size_t i = 0; i < host.size() * sizeof(float); ++i) {
      ASSERT_EQ(bytes[i], i < view_bytes ? 0 : kGradientFill) << "byte " << i;
    }
  }
}

// dsinks without query rows is 0; without keys every row is its sink alone (P_sink = 1, out = 0):
// dsinks[h] = sum of the head's dlse, and dq is 0.
TEST(BackwardZeroSizes, SinksGradientWithoutQueriesOrKeys) {
  using F = BackwardCallFixture;
  {
    F c;
    DeviceBuffer<float> sinks(c.ctx, F::kHeads), dsinks(c.ctx, F::kHeads);
    sinks.copy_from_host(std::vector<float>(F::kHeads, 0.5f));
    dsinks.fill_bytes(kGradientFill);
    c.options.sinks = sinks.data();
    c.backward.dsinks = dsinks.data();
    for (TensorView* view : {&c.q, &c.out, &c.dout, &c.dq}) view->shape[2] = 0;
    c.run();
    EXPECT_TRUE(all_zero(dsinks));
  }
  F c;
  c.k.shape[2] = c.v.shape[2] = c.dk.shape[2] = c.dv.shape[2] = 0;
  c.out_mem.fill_bytes(0);  // the forward's out without keys
  const float minus_inf = -std::numeric_limits<float>::infinity();
  const std::vector<float> sink_values{0.5f, minus_inf, -2.0f, 3.0f};
  std::vector<float> lse(F::kRows), dlse(F::kRows);
  for (size_t r = 0; r < F::kRows; ++r) {
    lse[r] = sink_values[(r / F::kSeqQ) % F::kHeads];
    dlse[r] = 0.25f * float(r % 7) - 0.5f;
  }
  c.lse_mem.copy_from_host(lse);
  DeviceBuffer<float> sinks(c.ctx, F::kHeads), dsinks(c.ctx, F::kHeads), dlse_mem(c.ctx, F::kRows);
  sinks.copy_from_host(sink_values);
  dlse_mem.copy_from_host(dlse);
  dsinks.fill_bytes(kGradientFill);
  c.options.sinks = sinks.data();
  c.backward.dsinks = dsinks.data();
  c.backward.dlse = dlse_mem.data();
  c.run();
  EXPECT_TRUE(all_zero(c.dq_mem));
  const std::vector<float> got = dsinks.to_host();
  for (int h = 0; h < F::kHeads; ++h) {
    double want = 0;
    for (size_t r = 0; r < F::kRows; ++r)
      if (int((r / F::kSeqQ) % F::kHeads) == h && sink_values[size_t(h)] != minus_inf) want += dlse[r];
    EXPECT_NEAR(got[size_t(h)], want, 1e-6) << "head " << h;
  }
}

// Without heads, sinks and dsinks are both empty arrays: a null sinks beside a non-null dsinks (as
// an empty PyTorch tensor may give) is accepted, and dsinks has nothing to receive.
TEST(BackwardZeroSizes, NoHeadsTakeDsinksBesideNullSinks) {
  BackwardCallFixture c;
  for (TensorView* view : {&c.q, &c.out, &c.dout, &c.dq}) view->shape[1] = 0;
  DeviceBuffer<float> dsinks(c.ctx, 1);
  dsinks.fill_bytes(kGradientFill);
  c.backward.dsinks = dsinks.data();
  c.run();
  EXPECT_TRUE(all_zero(c.dk_mem));
  EXPECT_TRUE(all_zero(c.dv_mem));
  EXPECT_TRUE(all_bytes(dsinks, kGradientFill));
}

// A zero-size call still validates first: a bad argument beside the zero size is rejected and
// nothing is zero-filled.
TEST(BackwardZeroSizes, StillValidated) {
  BackwardCallFixture c;
  c.k.shape[2] = c.v.shape[2] = c.dk.shape[2] = c.dv.shape[2] = 0;
  c.dq.dtype = DType::f16;
  EXPECT_REJECTED(c, "dq.dtype expected f32", "got f16");
}

}  // namespace
}  // namespace selfattn
