// Wrong cu_seqlens on the fused path: entries past total_q/total_k or negative must be clamped to
// the views (device metadata the host does not read), never followed out of q, k, v, out or lse.
// Before the clamp in flash_fwd_sequence.cuh, these calls faulted on the sim; each must also give
// exactly what the valid offsets it clamps to give. Offsets out of order are first made
// non-decreasing (running_max_offsets.cuh): before that, two sequences could share rows, and the
// sim reported two blocks writing the same output (forward and backward).
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "kv_cache_check.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using namespace kv_test;

TEST(FusedVarlenMetadata, CuSeqlensOutsideTheViewsAreClamped) {
  Context ctx;
  std::mt19937_64 rng(4);
  // Each bad case beside the valid offsets its clamp gives (entries into [0, total], each end at
  // least its begin: flash_fwd_sequence.cuh); empty where that clamp leaves a sequence longer than
  // max_seqlen_q, whose result the contract leaves open.
  struct Case {
    std::vector<int32_t> q, k, clamped_q, clamped_k;
  };
  const std::vector<Case> cases = {
      {{0, 4, 9}, {0, 1 << 30, 20}, {0, 4, 9}, {0, 20, 20}},
      {{0, 4, 1 << 30}, {0, 7, 20}, {0, 4, 9}, {0, 7, 20}},
      {{-(1 << 30), 4, 9}, {0, -(1 << 30), 20}, {0, 4, 9}, {0, 0, 20}},
      {{0, INT_MAX, 2}, {INT_MIN, 3, INT_MAX}, {}, {}},
  };
  for (DType dtype : {DType::f16, DType::f32}) {
    Tensor q = random_tensor(ctx, dtype, 1, 2, 9, 64, rng);
    Tensor k = random_tensor(ctx, dtype, 1, 1, 20, 64, rng);
    Tensor v = random_tensor(ctx, dtype, 1, 1, 20, 64, rng);
    // out and lse of one call, both poisoned first (the rows no sequence owns stay so).
    const auto run = [&](const std::vector<int32_t>& offsets_q, const std::vector<int32_t>& offsets_k) {
      DeviceBuffer<int32_t> cu_q(ctx, 3, "cu_seqlens_q"), cu_k(ctx, 3, "cu_seqlens_k");
      cu_q.copy_from_host(offsets_q);
      cu_k.copy_from_host(offsets_k);
      DeviceBuffer<unsigned char> out = poisoned(ctx, dtype, 2 * 9 * 64);
      DeviceBuffer<float> lse(ctx, 2 * 9, "lse");
      lse.fill_bytes(0xFF);
      AttentionOptions options;
      options.path = Path::fused;
      options.lse = lse.data();
      attention_varlen(ctx, q.view, k.view, v.view, TensorView::bhsd(out.data(), dtype, 1, 2, 9, 64), cu_q.data(),
                       cu_k.data(), 2, 5, 20, options);
      ctx.synchronize();
      return std::make_pair(out.to_host(), lse.to_host());
    };
    for (size_t i = 0; i < cases.size(); ++i) {
      const auto [out, lse] = run(cases[i].q, cases[i].k);  // faults on the sim if anything is followed out
      if (cases[i].clamped_q.empty()) continue;
      // Clamped means computed exactly as the valid offsets it clamps to: the same bits.
      const auto [want_out, want_lse] = run(cases[i].clamped_q, cases[i].clamped_k);
      EXPECT_TRUE(out == want_out) << to_string(dtype) << " case " << i << ": out differs from the clamped offsets' call";
      const bool same_lse = std::memcmp(lse.data(), want_lse.data(), lse.size() * sizeof(float)) == 0;  // NaN poison too
      EXPECT_TRUE(same_lse) << to_string(dtype) << " case " << i << ": lse differs from the clamped offsets' call";
    }
  }
}

// Out-of-order offsets beside the running maximum they are read as: the same bits, forward and
// backward. Each case has sequences that would otherwise overlap (query rows, key rows, or both).
struct OrderCase {
  std::vector<int32_t> q, k, ordered_q, ordered_k;
};
const std::vector<OrderCase>& out_of_order_cases() {
  static const std::vector<OrderCase> cases = {
      {{0, 6, 2, 9}, {0, 15, 5, 20}, {0, 6, 6, 9}, {0, 15, 15, 20}},  // both overlap: sequence 1 empty
      {{0, 3, 6, 9}, {0, 15, 5, 20}, {0, 3, 6, 9}, {0, 15, 15, 20}},  // keys only: sequence 1 has no key
      {{5, 2, 7, 9}, {0, 4, 12, 20}, {5, 5, 7, 9}, {0, 4, 12, 20}},   // rows 0-4 owned by nobody
      {{0, 9, 0, 9}, {0, 20, 0, 20}, {0, 9, 9, 9}, {0, 20, 20, 20}},  // the whole view twice
      {{0, 7, 3, 5}, {0, 8, 14, 20}, {0, 7, 7, 7}, {0, 8, 14, 20}},   // the last entry below an earlier one
  };
  return cases;
}

constexpr int kSequences = 3, kHeads = 2, kTotalQ = 9, kTotalK = 20, kHeadDim = 64;

struct Offsets {
  DeviceBuffer<int32_t> q, k;
  Offsets(Context& ctx, const std::vector<int32_t>& q_host, const std::vector<int32_t>& k_host)
      : q(ctx, q_host.size(), "cu_seqlens_q"), k(ctx, k_host.size(), "cu_seqlens_k") {
    q.copy_from_host(q_host);
    k.copy_from_host(k_host);
  }
};

// out and lse of one forward call on the fused path, both poisoned first.
std::pair<std::vector<unsigned char>, std::vector<float>> run_forward(Context& ctx, const Tensor& q, const Tensor& k,
                                                                      const Tensor& v,
                                                                      const std::vector<int32_t>& offsets_q,
                                                                      const std::vector<int32_t>& offsets_k) {
  const DType dtype = q.dtype;
  const int heads = int(q.view.heads()), total_q = int(q.view.seq()), total_k = int(k.view.seq());
  Offsets offsets(ctx, offsets_q, offsets_k);
  DeviceBuffer<unsigned char> out = poisoned(ctx, dtype, size_t(heads) * total_q * kHeadDim);
  DeviceBuffer<float> lse(ctx, size_t(heads) * total_q, "lse");
  lse.fill_bytes(0xFF);
  AttentionOptions options;
  options.path = Path::fused;
  options.causal = Causal::bottom_right;
  options.lse = lse.data();
  attention_varlen(ctx, q.view, k.view, v.view, TensorView::bhsd(out.data(), dtype, 1, heads, total_q, kHeadDim),
                   offsets.q.data(), offsets.k.data(), int(offsets_q.size()) - 1, total_q, total_k, options);
  ctx.synchronize();
  return {out.to_host(), lse.to_host()};
}

::testing::AssertionResult same_forward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                                        const OrderCase& c) {
  const auto [out, lse] = run_forward(ctx, q, k, v, c.q, c.k);
  const auto [want_out, want_lse] = run_forward(ctx, q, k, v, c.ordered_q, c.ordered_k);
  if (out != want_out) return ::testing::AssertionFailure() << "out differs from the ordered offsets' call";
  if (std::memcmp(lse.data(), want_lse.data(), lse.size() * sizeof(float)) != 0)  // NaN poison too
    return ::testing::AssertionFailure() << "lse differs from the ordered offsets' call";
  return ::testing::AssertionSuccess();
}

TEST(FusedVarlenMetadata, OffsetsOutOfOrderAreReadAsTheirRunningMaximum) {
  Context ctx;
  std::mt19937_64 rng = rng_for("FusedVarlenMetadata.OutOfOrder");
  for (DType dtype : {DType::bf16, DType::f32}) {  // the tensor-core kernel and the SIMT one
    Tensor q = random_tensor(ctx, dtype, 1, kHeads, kTotalQ, kHeadDim, rng);
    Tensor k = random_tensor(ctx, dtype, 1, 1, kTotalK, kHeadDim, rng);
    Tensor v = random_tensor(ctx, dtype, 1, 1, kTotalK, kHeadDim, rng);
    for (size_t i = 0; i < out_of_order_cases().size(); ++i) {
      EXPECT_TRUE(same_forward(ctx, q, k, v, out_of_order_cases()[i])) << to_string(dtype) << " case " << i;
    }
  }
}

// Enough sequences that each thread of the ordering kernel owns several entries and the maximum
// has to cross many threads: offsets rising by 0 or 1, a drop of 30 every 97 sequences, and one
// early spike whose maximum every entry for hundreds of sequences must see (until the offsets
// rise past it, those sequences are empty).
TEST(FusedVarlenMetadata, ManySequencesOutOfOrder) {
  Context ctx;
  std::mt19937_64 rng = rng_for("FusedVarlenMetadata.ManySequences");
  constexpr int kMany = 700, kTotal = 330, kSpikeAt = 20, kSpike = 260;
  Tensor q = random_tensor(ctx, DType::bf16, 1, 1, kTotal, kHeadDim, rng);
  Tensor k = random_tensor(ctx, DType::bf16, 1, 1, kTotal, kHeadDim, rng);
  Tensor v = random_tensor(ctx, DType::bf16, 1, 1, kTotal, kHeadDim, rng);
  std::uniform_int_distribution<int> die(0, 3);
  const auto random_offsets = [&] {
    std::vector<int32_t> offsets{0};
    for (int i = 0; i < kMany; ++i) offsets.push_back(offsets.back() + (i % 97 == 50 ? -30 : die(rng) > 0 ? 1 : 0));
    offsets[kSpikeAt] = kSpike;
    return offsets;
  };
  OrderCase c;
  c.q = random_offsets();
  c.k = random_offsets();
  for (const auto& [given, ordered] : {std::pair{&c.q, &c.ordered_q}, std::pair{&c.k, &c.ordered_k}}) {
    *ordered = *given;
    for (size_t i = 1; i < ordered->size(); ++i) (*ordered)[i] = std::max((*ordered)[i], (*ordered)[i - 1]);
  }
  ASSERT_NE(c.q, c.ordered_q);  // the case is out of order at all
  EXPECT_TRUE(same_forward(ctx, q, k, v, c));
}

// The backward's inputs over packed views of `heads` query heads (one kv head): random q, k, v,
// out and dout, a constant LSE (the checks compare two calls, not values) and two sinks.
struct BackwardInputs {
  Tensor q, k, v, out, dout;
  DeviceBuffer<float> lse, sinks;
  BackwardInputs(Context& ctx, std::mt19937_64& rng, int total_q, int total_k)
      : q(random_tensor(ctx, DType::bf16, 1, kHeads, total_q, kHeadDim, rng)),
        k(random_tensor(ctx, DType::bf16, 1, 1, total_k, kHeadDim, rng)),
        v(random_tensor(ctx, DType::bf16, 1, 1, total_k, kHeadDim, rng)),
        out(random_tensor(ctx, DType::bf16, 1, kHeads, total_q, kHeadDim, rng)),
        dout(random_tensor(ctx, DType::bf16, 1, kHeads, total_q, kHeadDim, rng)),
        lse(ctx, size_t(kHeads) * total_q, "lse"),
        sinks(ctx, kHeads, "sinks") {
    lse.copy_from_host(std::vector<float>(size_t(kHeads) * total_q, 2.0f));
    sinks.copy_from_host(std::vector<float>{0.5f, -1.0f});  // dsinks ends at cu_seqlens_q[batch]
  }
};

// dq, dk, dv and dsinks of one fused varlen backward, each poisoned first.
std::vector<std::vector<unsigned char>> run_backward(Context& ctx, const BackwardInputs& in,
                                                     const std::vector<int32_t>& offsets_q,
                                                     const std::vector<int32_t>& offsets_k, bool deterministic) {
  const DType dtype = DType::bf16;
  const int total_q = int(in.q.view.seq()), total_k = int(in.k.view.seq());
  Offsets offsets(ctx, offsets_q, offsets_k);
  std::vector<DeviceBuffer<unsigned char>> grads;
  grads.push_back(poisoned(ctx, dtype, size_t(kHeads) * total_q * kHeadDim));
  grads.push_back(poisoned(ctx, dtype, size_t(total_k) * kHeadDim));
  grads.push_back(poisoned(ctx, dtype, size_t(total_k) * kHeadDim));
  grads.push_back(poisoned(ctx, DType::f32, kHeads));
  AttentionOptions options;
  options.path = Path::fused;
  options.causal = Causal::top_left;
  options.sinks = in.sinks.data();
  BackwardOptions backward;
  backward.deterministic = deterministic;
  backward.dsinks = reinterpret_cast<float*>(grads[3].data());
  attention_varlen_backward(ctx, in.q.view, in.k.view, in.v.view, in.out.view, in.dout.view, in.lse.data(),
                            TensorView::bhsd(grads[0].data(), dtype, 1, kHeads, total_q, kHeadDim),
                            TensorView::bhsd(grads[1].data(), dtype, 1, 1, total_k, kHeadDim),
                            TensorView::bhsd(grads[2].data(), dtype, 1, 1, total_k, kHeadDim), offsets.q.data(),
                            offsets.k.data(), int(offsets_q.size()) - 1, total_q, total_k, options, backward);
  ctx.synchronize();
  std::vector<std::vector<unsigned char>> host;
  for (const auto& g : grads) host.push_back(g.to_host());
  return host;
}

// With every sequence's rows its own, even dQ's fp32 atomics add the same terms in the same order
// per element (one key-tile block per sequence and kv head here): the bits agree in both modes.
::testing::AssertionResult same_backward(Context& ctx, const BackwardInputs& in, const OrderCase& c,
                                         bool deterministic) {
  const auto got = run_backward(ctx, in, c.q, c.k, deterministic);
  const auto want = run_backward(ctx, in, c.ordered_q, c.ordered_k, deterministic);
  const char* names[] = {"dq", "dk", "dv", "dsinks"};
  for (int g = 0; g < 4; ++g) {
    if (got[g] != want[g]) {
      return ::testing::AssertionFailure() << names[g] << (deterministic ? " (deterministic)" : "")
                                           << " differs from the ordered offsets' call";
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(FusedVarlenMetadata, BackwardReadsOffsetsOutOfOrderAsTheirRunningMaximum) {
  Context ctx;
  std::mt19937_64 rng = rng_for("FusedVarlenMetadata.BackwardOutOfOrder");
  const BackwardInputs in(ctx, rng, kTotalQ, kTotalK);
  for (bool deterministic : {true, false}) {
    for (size_t i = 0; i < out_of_order_cases().size(); ++i) {
      EXPECT_TRUE(same_backward(ctx, in, out_of_order_cases()[i], deterministic)) << "case " << i;
    }
  }
}

// Without keys no path runs, but dsinks still sums each head's rows up to cu_seqlens_q[batch]: read
// as their running maximum there too.
TEST(FusedVarlenMetadata, BackwardWithoutKeysReadsOffsetsOutOfOrderAsTheirRunningMaximum) {
  Context ctx;
  std::mt19937_64 rng = rng_for("FusedVarlenMetadata.BackwardWithoutKeys");
  const BackwardInputs in(ctx, rng, kTotalQ, 0);
  const OrderCase c{{0, 7, 3, 5}, {0, 0, 0, 0}, {0, 7, 7, 7}, {0, 0, 0, 0}};
  EXPECT_TRUE(same_backward(ctx, in, c, /*deterministic=*/true));
}

// Offsets that are garbage throughout: random entries across the views and far outside them,
// INT_MIN and INT_MAX among them. Each call must stay inside its views (the sim's guard zones and
// write-conflict check would fail it) and equal the call with the running maximum.
TEST(FusedVarlenMetadata, GarbageOffsetsStayInsideTheViews) {
  Context ctx;
  std::mt19937_64 rng = rng_for("FusedVarlenMetadata.Garbage");
  constexpr int kBatch = 60, kTotal = 90;
  const BackwardInputs in(ctx, rng, kTotal, kTotal);
  std::uniform_int_distribution<int32_t> near(-20, kTotal + 20), anywhere(INT_MIN, INT_MAX);
  std::uniform_int_distribution<int> kind(0, 29);  // rare extremes: a huge entry empties every later sequence
  const auto garbage = [&] {
    std::vector<int32_t> offsets(kBatch + 1);
    for (int32_t& o : offsets) {
      const int roll = kind(rng);
      o = roll == 0 ? INT_MIN : roll == 1 ? INT_MAX : roll == 2 ? anywhere(rng) : near(rng);
    }
    return offsets;
  };
  for (int trial = 0; trial < 3; ++trial) {
    OrderCase c;
    c.q = garbage();
    c.k = garbage();
    for (const auto& [given, ordered] : {std::pair{&c.q, &c.ordered_q}, std::pair{&c.k, &c.ordered_k}}) {
      *ordered = *given;
      for (size_t i = 1; i < ordered->size(); ++i) (*ordered)[i] = std::max((*ordered)[i], (*ordered)[i - 1]);
    }
    EXPECT_TRUE(same_forward(ctx, in.q, in.k, in.v, c)) << "trial " << trial;
    EXPECT_TRUE(same_backward(ctx, in, c, /*deterministic=*/true)) << "trial " << trial;
  }
}

}  // namespace
}  // namespace selfattn
