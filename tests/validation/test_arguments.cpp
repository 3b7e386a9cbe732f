// Every documented bad input of attention(), attention_varlen() and resolve_path() gets its
// documented error type and message, and leaves `out` untouched; the calls that need no kernel
// (zero sizes, no keys) do what attention.h promises. Sim backend; nothing here runs an attention
// kernel. self_attention()'s: test_self_attention_arguments.cpp.
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "selfattn/selfattn.h"
#include "test_helpers.h"

namespace selfattn {
namespace {

using host_test::kPoison;
using host_test::throws_with;
using host_test::untouched;

// q [2, 4, 5, 3], k/v [2, 2, 7, 3], out like q: a valid GQA call to break one argument at a time.
struct Call {
  static constexpr int64_t kBatch = 2, kHeads = 4, kKvHeads = 2, kSeqQ = 5, kSeqK = 7, kDim = 3;
  Context ctx{Backend::sim};
  DeviceBuffer<float> q_mem{ctx, kBatch * kHeads * kSeqQ * kDim};
  DeviceBuffer<float> k_mem{ctx, kBatch * kKvHeads * kSeqK * kDim};
  DeviceBuffer<float> v_mem{ctx, kBatch * kKvHeads * kSeqK * kDim};
  DeviceBuffer<float> out_mem{ctx, kBatch * kHeads * kSeqQ * kDim};
  DeviceBuffer<float> lse_mem{ctx, kBatch * kHeads * kSeqQ};
  TensorView q = TensorView::bhsd(q_mem.data(), DType::f32, kBatch, kHeads, kSeqQ, kDim);
  TensorView k = TensorView::bhsd(k_mem.data(), DType::f32, kBatch, kKvHeads, kSeqK, kDim);
  TensorView v = TensorView::bhsd(v_mem.data(), DType::f32, kBatch, kKvHeads, kSeqK, kDim);
  TensorView out = TensorView::bhsd(out_mem.data(), DType::f32, kBatch, kHeads, kSeqQ, kDim);
  AttentionOptions options;

  Call() {
    for (auto* buffer : {&q_mem, &k_mem, &v_mem}) buffer->copy_from_host(std::vector<float>(buffer->size(), 0.25f));
    out_mem.fill_bytes(kPoison);
    lse_mem.fill_bytes(kPoison);
  }
  void run() { attention(ctx, q, k, v, out, options); }
};

// A bad argument: InvalidArgument whose message contains `parts`, and out and lse untouched.
#define EXPECT_REJECTED(call, ...)                                                         \
  do {                                                                                     \
    EXPECT_TRUE(throws_with<InvalidArgument>([&] { (call).run(); }, {__VA_ARGS__}));       \
    EXPECT_TRUE(untouched((call).out_mem));                                                \
    EXPECT_TRUE(untouched((call).lse_mem));                                                \
  } while (0)

TEST(AttentionArguments, NullData) {
  Call c;
  c.q.data = nullptr;
  EXPECT_REJECTED(c, "attention", "q.data expected non-null, got null");
}

TEST(AttentionArguments, ShapeMismatches) {
  { Call c; c.k.shape[0] = 3; EXPECT_REJECTED(c, "k.shape[0] (batch) expected 2", "got 3"); }
  { Call c; c.out.shape[1] = 2; EXPECT_REJECTED(c, "out.shape[1] (heads) expected 4", "got 2"); }
  { Call c; c.out.shape[2] = 4; EXPECT_REJECTED(c, "out.shape[2] (seq) expected 5", "got 4"); }
  { Call c; c.v.shape[2] = 6; EXPECT_REJECTED(c, "v.shape[2] (seq) expected 7", "k.shape[2]", "got 6"); }
  { Call c; c.v.shape[1] = 1; EXPECT_REJECTED(c, "v.shape[1] (heads) expected 2", "got 1"); }
  { Call c; c.k.shape[3] = 2; EXPECT_REJECTED(c, "k.shape[3] (head_dim) expected 3", "got 2"); }
  // v may have a head dim of its own (head_dim_v); out must have v's.
  { Call c; c.out.shape[3] = 2; EXPECT_REJECTED(c, "out.shape[3] (head_dim) expected 3 (v.shape[3]", "got 2"); }
  {
    Call c;
    c.v.shape[3] = c.out.shape[3] = 0;
    EXPECT_REJECTED(c, "v.shape[3] (head_dim) expected >= 1 when there are query rows, got 0");
  }
}

TEST(AttentionArguments, DtypeMismatch) {
  { Call c; c.v.dtype = DType::f16; EXPECT_REJECTED(c, "v.dtype expected f32", "got f16"); }
  { Call c; c.out.dtype = DType::bf16; EXPECT_REJECTED(c, "out.dtype expected f32", "got bf16"); }
  {
    Call c;
    c.k.dtype = DType(7);
    EXPECT_REJECTED(c, "k.dtype expected f32, f16, bf16, e4m3 or e5m2", "7");
  }
  {
    Call c;
    c.q.dtype = c.k.dtype = c.v.dtype = DType::e4m3;
    c.out.dtype = DType::e5m2;
    EXPECT_REJECTED(c, "out.dtype expected f32, f16 or bf16, got e5m2");
  }
}

TEST(AttentionArguments, HeadDimStrideMustBeOne) {
  Call c;
  c.k.strides[3] = 2;
  EXPECT_REJECTED(c, "k.strides[3] (head_dim) expected 1, got 2");
}

TEST(AttentionArguments, NegativeSizesAndStrides) {
  { Call c; c.q.shape[2] = -1; EXPECT_REJECTED(c, "q.shape[2] (seq) expected >= 0, got -1"); }
  { Call c; c.v.strides[1] = -21; EXPECT_REJECTED(c, "v.strides[1] (heads) expected >= 0, got -21"); }
}

TEST(AttentionArguments, KvHeadsMustDivideHeads) {
  Call c;
  c.k.shape[1] = c.v.shape[1] = 3;
  EXPECT_REJECTED(c, "kv_heads", "divisor of q.shape[1] (heads) = 4", "got 3");
}

TEST(AttentionArguments, OutMustNotOverlapInputs) {
  { Call c; c.out.data = c.k.data; EXPECT_REJECTED(c, "out expected not to overlap k"); }
  {
    // Overlap by one element only: out starts at v's last element.
    Call c;
    c.out = TensorView::bhsd(c.out_mem.data(), DType::f32, 2, 4, 5, 3);
    c.v.data = c.out_mem.data() + 14;  // the last element of out = [1, 1, 5, 3]
    c.v.shape = {1, 1, 1, 3};
    c.k.shape = {1, 1, 1, 3};
    c.q.shape[0] = c.out.shape[0] = 1;
    c.q.shape[1] = c.out.shape[1] = 1;
    EXPECT_TRUE(throws_with<InvalidArgument>([&] { c.run(); }, {"out expected not to overlap v"}));
  }
}

TEST(AttentionArguments, LseMisuse) {
  Call c;
  c.options.lse = c.out_mem.data() + 7;
  EXPECT_REJECTED(c, "options.lse expected not to overlap out");
  c.options.lse = c.q_mem.data();
  EXPECT_REJECTED(c, "options.lse expected not to overlap q");
}

TEST(AttentionArguments, KeyLengthsMustNotLieInOutOrLse) {
  Call c;
  c.options.key_lengths = reinterpret_cast<const int32_t*>(c.out_mem.data() + 3);
  EXPECT_REJECTED(c, "options.key_lengths expected not to overlap out");
  c.options.lse = c.lse_mem.data();
  c.options.key_lengths = reinterpret_cast<const int32_t*>(c.lse_mem.data() + 39);  // the last lse entry
  EXPECT_REJECTED(c, "options.key_lengths expected not to overlap options.lse");
}

// The naive and cublas paths count (batch, head) pairs in int32: more is refused, not wrapped.
TEST(AttentionArguments, BatchTimesHeadsFitsInt32) {
  Call c;
  c.q.shape[0] = c.k.shape[0] = c.v.shape[0] = c.out.shape[0] = 60000;
  c.q.shape[1] = c.out.shape[1] = 40000;
  EXPECT_REJECTED(c, "q.shape[0] * q.shape[1] (batch * heads) expected <= 2147483647, got 2400000000");
}

// Every dimension stops at 2^31 - 2^16, so that the kernels' int loops over keys (stepping by a
// block of threads, rounding up to a tile) cannot wrap. Stride-0 key views make such a length cheap.
TEST(AttentionArguments, DimensionsStayBelowTheLoopLimit) {
  Call c;
  for (TensorView* view : {&c.k, &c.v}) {
    view->shape[2] = 2147418113;
    view->strides[2] = 0;
  }
  EXPECT_REJECTED(c, "k.shape[2] (seq) expected <= 2147418112, got 2147418113");
}

TEST(AttentionArguments, SinksMisuse) {
  { Call c; c.options.sinks = c.out_mem.data() + 2; EXPECT_REJECTED(c, "options.sinks expected not to overlap out"); }
  {
    Call c;
    c.options.lse = c.lse_mem.data();
    c.options.sinks = c.lse_mem.data() + c.lse_mem.size() - 1;  // heads = 4 floats from the last lse entry
    EXPECT_REJECTED(c, "options.sinks expected not to overlap options.lse");
  }
  {
    Call c;
    DeviceBuffer<float> sinks(c.ctx, Call::kHeads + 1);
    c.options.sinks = reinterpret_cast<const float*>(reinterpret_cast<const char*>(sinks.data()) + 2);
    EXPECT_REJECTED(c, "options.sinks expected 4-byte alignment");
  }
}

// Elements are loaded whole: a pointer off its element size faults on the GPU, so it is refused.
TEST(AttentionArguments, MisalignedPointersAreRejected) {
  const auto off_by_two = [](const void* data) { return static_cast<const char*>(data) + 2; };
  { Call c; c.q.data = const_cast<char*>(off_by_two(c.q_mem.data())); EXPECT_REJECTED(c, "q.data expected alignment to its element size 4 (f32)"); }
  { Call c; c.out.data = const_cast<char*>(off_by_two(c.out_mem.data())); EXPECT_REJECTED(c, "out.data expected alignment"); }
  {
    Call c;
    c.options.lse = reinterpret_cast<float*>(const_cast<char*>(off_by_two(c.lse_mem.data())));
    EXPECT_REJECTED(c, "options.lse expected 4-byte alignment");
  }
  {
    Call c;
    DeviceBuffer<int32_t> lengths(c.ctx, 3);
    c.options.key_lengths = reinterpret_cast<const int32_t*>(off_by_two(lengths.data()));
    EXPECT_REJECTED(c, "options.key_lengths expected 4-byte alignment");
  }
}

// Blocks write out's elements in parallel: two indices on one address would race.
TEST(AttentionArguments, OutElementsNeedAddressesOfTheirOwn) {
  { Call c; c.out.strides[2] = 0; EXPECT_REJECTED(c, "out.strides[2] (seq) = 0 makes elements of out share addresses"); }
  { Call c; c.out.strides[1] = Call::kDim; EXPECT_REJECTED(c, "makes elements of out share addresses"); }
}

TEST(AttentionArguments, ScaleMustBeFinite) {
  Call c;
  c.options.scale = std::numeric_limits<float>::quiet_NaN();
  EXPECT_REJECTED(c, "options.scale expected a finite number");
  c.options.scale = std::numeric_limits<float>::infinity();
  EXPECT_REJECTED(c, "options.scale");
}

TEST(AttentionArguments, CausalMustBeKnown) {
  Call c;
  c.options.causal = Causal(9);
  EXPECT_REJECTED(c, "options.causal expected none, top_left or bottom_right");
}

TEST(AttentionArguments, HeadDimZeroWithRowsIsRejected) {
  Call c;
  c.q.shape[3] = c.k.shape[3] = c.v.shape[3] = c.out.shape[3] = 0;
  EXPECT_REJECTED(c, "q.shape[3] (head_dim) expected >= 1");
}

TEST(AttentionArguments, ResolvePathValidatesToo) {
  Call c;
  c.k.shape[0] = 1;
  EXPECT_TRUE(throws_with<InvalidArgument>([&] { resolve_path(c.ctx, c.q, c.k, c.v); }, {"k.shape[0] (batch)"}));
}

// ---- varlen ----

struct VarlenCall : Call {
  DeviceBuffer<int32_t> cu_q{ctx, 3}, cu_k{ctx, 3};
  int batch = 2, max_q = 3, max_k = 4;
  VarlenCall() {
    // Two sequences packed into [1, heads, total, dim]: q rows {0..2, 3..4}, k rows {0..3, 4..6}.
    q.shape[0] = k.shape[0] = v.shape[0] = out.shape[0] = 1;
    cu_q.copy_from_host(std::vector<int32_t>{0, 3, 5});
    cu_k.copy_from_host(std::vector<int32_t>{0, 4, 7});
  }
  void run() { attention_varlen(ctx, q, k, v, out, cu_q.data(), cu_k.data(), batch, max_q, max_k, options); }
};

TEST(VarlenArguments, Rejected) {
  { VarlenCall c; c.q.shape[0] = c.k.shape[0] = c.v.shape[0] = c.out.shape[0] = 2; EXPECT_REJECTED(c, "attention_varlen", "q.shape[0] (batch) expected 1"); }
  { VarlenCall c; c.batch = -1; EXPECT_REJECTED(c, "batch expected >= 0, got -1"); }
  { VarlenCall c; c.max_q = -2; EXPECT_REJECTED(c, "max_seqlen_q expected >= 0, got -2"); }
  { VarlenCall c; c.max_k = 8; EXPECT_REJECTED(c, "max_seqlen_k expected <= k.shape[2] (total_k) = 7, got 8"); }
  {
    // key_lengths (seqused_k) are read while out is written.
    VarlenCall c;
    c.options.key_lengths = static_cast<const int32_t*>(c.out.data);
    EXPECT_REJECTED(c, "options.key_lengths expected not to overlap out");
  }
  {
    VarlenCall c;
    EXPECT_TRUE(throws_with<InvalidArgument>(
        [&] { attention_varlen(c.ctx, c.q, c.k, c.v, c.out, nullptr, c.cu_k.data(), 2, 3, 4); },
        {"cu_seqlens_q expected non-null"}));
    EXPECT_TRUE(untouched(c.out_mem));
  }
  { VarlenCall c; c.out.dtype = DType::f16; EXPECT_REJECTED(c, "out.dtype expected f32"); }
  {
    // The offsets are read while out is written: they may not lie in it, and must be aligned.
    VarlenCall c;
    const auto* in_out = reinterpret_cast<const int32_t*>(c.out_mem.data());
    EXPECT_TRUE(throws_with<InvalidArgument>(
        [&] { attention_varlen(c.ctx, c.q, c.k, c.v, c.out, in_out, c.cu_k.data(), 2, 3, 4); },
        {"cu_seqlens_q expected not to overlap out"}));
    const auto* misaligned = reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(c.cu_k.data()) + 2);
    EXPECT_TRUE(throws_with<InvalidArgument>(
        [&] { attention_varlen(c.ctx, c.q, c.k, c.v, c.out, c.cu_q.data(), misaligned, 2, 3, 4); },
        {"cu_seqlens_k expected 4-byte alignment"}));
    EXPECT_TRUE(untouched(c.out_mem));
  }
}

// Every sequence's cu_seqlens are checked before the first sequence is computed.
TEST(VarlenArguments, BadLaterSequenceWritesNothing) {
  for (Path path : {Path::naive, Path::cublas}) {
    VarlenCall c;
    c.options.path = path;
    c.options.lse = c.lse_mem.data();
    c.cu_k.copy_from_host(std::vector<int32_t>{0, 4, 9});  // sequence 1 ends past total_k = 7
    EXPECT_REJECTED(c, "attention_varlen: sequence 1 has rows [3, 5) of q and [4, 9) of k");
  }
}

// ---- calls that need no kernel ----

TEST(ZeroSizes, NoQueryRowsWritesNothing) {
  for (int dim = 0; dim < 3; ++dim) {
    Call c;
    c.options.lse = c.lse_mem.data();
    c.q.shape[dim] = c.out.shape[dim] = 0;  // batch, heads or seq_q
    if (dim == 0) c.k.shape[0] = c.v.shape[0] = 0;
    c.run();
    EXPECT_TRUE(untouched(c.out_mem)) << dim;
    EXPECT_TRUE(untouched(c.lse_mem)) << dim;
  }
  Context ctx(Backend::sim);
  const TensorView empty = TensorView::bhsd(nullptr, DType::f16, 0, 8, 16, 64);
  attention(ctx, empty, empty, empty, empty);  // null data is fine when there are no elements
}

// seq_k == 0: out rows are 0 and LSE is -inf, whatever out's layout.
TEST(ZeroSizes, NoKeysGiveZeroRowsAndMinusInfinityLse) {
  for (bool interleaved : {false, true}) {
    Call c;
    c.k.shape[2] = c.v.shape[2] = 0;
    c.options.lse = c.lse_mem.data();
    if (interleaved) c.out = TensorView::bshd(c.out_mem.data(), DType::f32, 2, 4, 5, 3);
    c.run();
    EXPECT_EQ(c.out_mem.to_host(), std::vector<float>(c.out_mem.size(), 0.0f));
    EXPECT_EQ(c.lse_mem.to_host(), std::vector<float>(c.lse_mem.size(), -std::numeric_limits<float>::infinity()));
  }
}

// With sinks, a row without keys is its sink alone: out 0, LSE the head's sink (-inf for a head
// without one); padded and varlen.
TEST(ZeroSizes, NoKeysWithSinksGiveTheSinksLse) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  const std::vector<float> sink_values{0.5f, minus_inf, -3.25f, 7.0f};
  for (bool varlen : {false, true}) {
    VarlenCall c;
    DeviceBuffer<float> sinks(c.ctx, Call::kHeads);
    sinks.copy_from_host(sink_values);
    c.options.sinks = sinks.data();
    c.options.lse = c.lse_mem.data();
    if (varlen) {
      c.max_k = 0;
      c.run();
    } else {
      Call& padded = c;
      padded.q.shape[0] = padded.out.shape[0] = Call::kBatch;
      c.k = TensorView::bhsd(c.k_mem.data(), DType::f32, Call::kBatch, Call::kKvHeads, 0, Call::kDim);
      c.v = c.k;
      padded.Call::run();
    }
    const int64_t rows_per_head = varlen ? Call::kSeqQ : Call::kSeqQ, batches = varlen ? 1 : Call::kBatch;
    const std::vector<float> lse = c.lse_mem.to_host();
    for (int64_t b = 0; b < batches; ++b)
      for (int64_t h = 0; h < Call::kHeads; ++h)
        for (int64_t i = 0; i < rows_per_head; ++i)
          EXPECT_EQ(lse[size_t((b * Call::kHeads + h) * rows_per_head + i)], sink_values[size_t(h)])
              << (varlen ? "varlen" : "padded") << " b" << b << " h" << h << " row " << i;
    const std::vector<float> out = c.out_mem.to_host();
    for (size_t i = 0; i < size_t(batches * Call::kHeads * Call::kSeqQ * Call::kDim); ++i) EXPECT_EQ(out[i], 0.0f);
  }
}

TEST(ZeroSizes, NoKeysWithAGappedOutWritesOnlyItsElements) {
  // out views heads 0..1 of a [2, 5, 3, 3] bshd buffer (heads interleaved): the other heads' bytes stay.
  Context ctx(Backend::sim);
  DeviceBuffer<float> q_mem(ctx, 2 * 2 * 5 * 3), kv_mem(ctx, 1), out_mem(ctx, 2 * 5 * 3 * 3);
  q_mem.fill_bytes(0);
  out_mem.fill_bytes(kPoison);
  const TensorView q = TensorView::bhsd(q_mem.data(), DType::f32, 2, 2, 5, 3);
  const TensorView kv = TensorView::bhsd(kv_mem.data(), DType::f32, 2, 1, 0, 3);
  TensorView out = TensorView::bshd(out_mem.data(), DType::f32, 2, 3, 5, 3);
  out.shape[1] = 2;
  attention(ctx, q, kv, kv, out);
  const std::vector<float> host = out_mem.to_host();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t s = 0; s < 5; ++s)
      for (int64_t h = 0; h < 3; ++h)
        for (int64_t d = 0; d < 3; ++d) {
          const float value = host[size_t(((b * 5 + s) * 3 + h) * 3 + d)];
          if (h < 2) {
            EXPECT_EQ(value, 0.0f);
          } else {
            uint32_t bits;
            std::memcpy(&bits, &value, 4);
            EXPECT_EQ(bits, 0xABABABABu);
          }
        }
}

TEST(ZeroSizes, VarlenWithoutKeys) {
  VarlenCall c;
  c.max_k = 0;
  c.options.lse = c.lse_mem.data();
  c.run();
  // Only the first heads * total_q entries of lse belong to the varlen call.
  const std::vector<float> lse = c.lse_mem.to_host();
  for (size_t i = 0; i < size_t(Call::kHeads * Call::kSeqQ); ++i) EXPECT_EQ(lse[i], -std::numeric_limits<float>::infinity());
  const std::vector<float> out = c.out_mem.to_host();
  for (size_t i = 0; i < size_t(Call::kHeads * Call::kSeqQ * Call::kDim); ++i) EXPECT_EQ(out[i], 0.0f);
}

// ---- path choice ----

TEST(PathChoice, ExplicitPathRunsOrSaysWhyNot) {
  for (Path path : {Path::naive, Path::cublas, Path::fused}) {
    Call c;
    c.options.path = path;
    try {
      c.run();
      EXPECT_TRUE(path_available(c.ctx, path)) << to_string(path) << " ran but says it is not available";
    } catch (const NotAvailable& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("path ") + to_string(path)), std::string::npos) << e.what();
      EXPECT_TRUE(untouched(c.out_mem));
    }
  }
}

TEST(PathChoice, AutomaticPicksAnAvailablePathOrListsEveryReason) {
  Call c;
  try {
    const Path chosen = resolve_path(c.ctx, c.q, c.k, c.v);
    EXPECT_NE(chosen, Path::automatic);
    EXPECT_TRUE(path_available(c.ctx, chosen));
  } catch (const NotAvailable& e) {
    for (const char* name : {"fused: ", "naive: ", "cublas: ", "sim backend"}) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(path_available(c.ctx, Path::automatic));
}

}  // namespace
}  // namespace selfattn
