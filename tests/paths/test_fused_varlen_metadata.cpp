// Wrong cu_seqlens on the fused path: entries past total_q/total_k or negative must be clamped to
// the views (device metadata the host does not read), never followed out of q, k, v, out or lse.
// Before the clamp in flash_fwd_sequence.cuh, these calls faulted on the sim.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <vector>

#include "kv_cache_check.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using namespace kv_test;

TEST(FusedVarlenMetadata, CuSeqlensOutsideTheViewsAreClamped) {
  Context ctx;
  std::mt19937_64 rng(4);
  const std::vector<std::vector<int32_t>> bad_q = {{0, 4, 9}, {0, 4, 1 << 30}, {-(1 << 30), 4, 9}, {0, INT_MAX, 2}};
  const std::vector<std::vector<int32_t>> bad_k = {{0, 1 << 30, 20}, {0, 7, 20}, {0, -(1 << 30), 20}, {INT_MIN, 3, INT_MAX}};
  for (DType dtype : {DType::f16, DType::f32}) {
    Tensor q = random_tensor(ctx, dtype, 1, 2, 9, 64, rng);
    Tensor k = random_tensor(ctx, dtype, 1, 1, 20, 64, rng);
    Tensor v = random_tensor(ctx, dtype, 1, 1, 20, 64, rng);
    for (size_t i = 0; i < bad_q.size(); ++i) {
      DeviceBuffer<int32_t> cu_q(ctx, 3, "cu_seqlens_q"), cu_k(ctx, 3, "cu_seqlens_k");
      cu_q.copy_from_host(bad_q[i]);
      cu_k.copy_from_host(bad_k[i]);
      DeviceBuffer<unsigned char> out = poisoned(ctx, dtype, 2 * 9 * 64);
      DeviceBuffer<float> lse(ctx, 2 * 9, "lse");
      AttentionOptions options;
      options.path = Path::fused;
      options.lse = lse.data();
      attention_varlen(ctx, q.view, k.view, v.view, TensorView::bhsd(out.data(), dtype, 1, 2, 9, 64), cu_q.data(),
                       cu_k.data(), 2, 5, 20, options);
      ctx.synchronize();
      // Rows some clamped sequence owns are finite; the rest may stay poisoned. Only safety is asked.
      for (float value : download(out, dtype, 2 * 9 * 64)) ASSERT_FALSE(std::isinf(value)) << to_string(dtype) << " case " << i;
    }
  }
}

}  // namespace
}  // namespace selfattn
