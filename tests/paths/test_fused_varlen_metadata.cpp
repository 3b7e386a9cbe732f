// Wrong cu_seqlens on the fused path: entries past total_q/total_k or negative must be clamped to
// the views (device metadata the host does not read), never followed out of q, k, v, out or lse.
// Before the clamp in flash_fwd_sequence.cuh, these calls faulted on the sim; each must also give
// exactly what the valid offsets it clamps to give.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace selfattn
