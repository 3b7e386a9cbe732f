// Attention over caches whose K and V rows differ in length (kv_cache.h): V in a pool of its own
// with head_dim_v != head_dim (MLA's (192, 128) expanded rows, and V longer than K), and latent
// caches whose V is a view of K's leading columns (DeepSeek's absorbed MLA: K rows [c_kv | k_rope],
// V = c_kv), bf16 and FP8, every path; dense and packed calls; the split-KV kernels' bound named.
// Appends into such caches: test_kv_cache_append.cpp; bad views: validation/test_kv_cache_arguments.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kv_cache_check.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using namespace kv_test;

const Path kPaths[] = {Path::naive, Path::cublas, Path::fused};

CacheSpec with_v_dim(CacheSpec spec, int head_dim_v, bool v_in_k = false) {
  spec.head_dim_v = head_dim_v;
  spec.v_in_k = v_in_k;
  return spec;
}

// V in its own pool: (192, 128) paged with GQA 4 over one and three splits (the SIMT split-KV
// kernel: the tensor-core one takes one head dim), V longer than K (32, 64), V of 8 columns
// (element-wise staging), page size 1, contiguous BSHD.
TEST(KvCacheHeadDims, SeparatePoolsEveryPath) {
  Context ctx;
  std::vector<AttendCase> cases;
  cases.push_back(attend(with_v_dim(paged(DType::bf16, 3, 2, 192, 16, 3, {0, 17, 40}), 128), 8, 3));
  cases.push_back(attend(with_v_dim(contiguous(DType::f32, 2, 1, 32, 20, {7, 20}, false), 64), 2, 2, Causal::none));
  cases.push_back(attend(with_v_dim(paged(DType::f16, 2, 2, 64, 1, 19, {1, 19}), 8), 2, 7));
  for (const AttendCase& c : cases)
    for (Path path : kPaths) EXPECT_TRUE(check_attend(ctx, c, path));
  AttendCase split = cases[0];
  for (int splits : {1, 3}) {
    split.num_splits = splits;
    EXPECT_TRUE(check_attend(ctx, split, Path::fused));
  }
}

// A latent cache, MQA (one kv head, 16 query heads as the tile's rows), 1 and 2 new rows
// (speculative decoding): (96, 64) on the SIMT split-KV kernel, with rotary on q's rope columns
// (first_dim 64) and splits; an FP8 latent cache (one scale for K and its V view); and DeepSeek's
// own (576, 512) on every path (fused: the latent kernel).
TEST(KvCacheHeadDims, LatentCacheEveryPath) {
  Context ctx;
  for (int seq_q : {1, 2}) {
    AttendCase c = attend(with_v_dim(paged(DType::bf16, 3, 1, 96, 16, 3, {33, 1, 48}), 64, true), 16, seq_q);
    for (Path path : kPaths) EXPECT_TRUE(check_attend(ctx, c, path));
    c.rotary = std::make_pair(32, true);
    c.rotary_first_dim = 64;
    c.num_splits = 3;
    EXPECT_TRUE(check_attend(ctx, c, Path::fused));
    EXPECT_TRUE(check_attend(ctx, c, Path::cublas));
  }
  CacheSpec fp8 = with_v_dim(paged(DType::e4m3, 2, 1, 96, 16, 2, {20, 32}), 64, true);
  fp8.k_scale = fp8.v_scale = {0.375f};
  for (Path path : kPaths) {
    AttendCase c = attend(fp8, 16, 2);
    c.query_dtype = DType::bf16;
    EXPECT_TRUE(check_attend(ctx, c, path));
  }
  const CacheSpec deepseek = with_v_dim(paged(DType::bf16, 2, 1, 576, 64, 2, {70, 128}), 512, true);
  for (Path path : {Path::naive, Path::cublas, Path::fused, Path::automatic})
    EXPECT_TRUE(check_attend(ctx, attend(deepseek, 16, 2), path));
}

// The latent kernel (decode_latent_mma.cuh, DeepSeek's (576, 512)) at the edges of its work
// division: 16 rows per block (8 heads x 3 rows: a partial second block; 16 x 1: one whole),
// 32-key tiles (lengths 0, 1, 31, 32, 33, 70, a page of 64 and past it), one split and several,
// f16 and bf16, bf16 q over an e4m3 cache; then windows, softcap, ALiBi and a bias, and left
// padding with placed rows, against the reference.
TEST(KvCacheHeadDims, LatentKernelEdges) {
  Context ctx;
  for (DType dtype : {DType::bf16, DType::f16}) {
    const CacheSpec spec = with_v_dim(paged(dtype, 4, 1, 576, 64, 2, {0, 33, 70, 1}), 512, true);
    for (const auto& [heads, seq_q] : {std::pair<int, int>{16, 1}, {8, 3}}) {
      AttendCase c = attend(spec, heads, seq_q);
      for (int splits : {1, 3}) {
        c.num_splits = splits;
        EXPECT_TRUE(check_attend(ctx, c, Path::fused));
      }
    }
  }
  AttendCase edges = attend(with_v_dim(contiguous(DType::bf16, 3, 1, 576, 65, {31, 32, 65}, false), 512, true), 16, 2);
  EXPECT_TRUE(check_attend(ctx, edges, Path::fused));
  CacheSpec fp8 = with_v_dim(paged(DType::e4m3, 2, 1, 576, 64, 2, {40, 128}), 512, true);
  fp8.k_scale = fp8.v_scale = {0.625f};
  AttendCase quantized = attend(fp8, 16, 2);
  quantized.query_dtype = DType::bf16;
  for (int splits : {1, 2}) {
    quantized.num_splits = splits;
    EXPECT_TRUE(check_attend(ctx, quantized, Path::fused));
  }
  testing::ScoreModsCase mods;
  mods.window_left = 20;
  mods.softcap = 30.0f;
  mods.alibi = testing::AlibiSlopes::heads;
  mods.bias = testing::BiasLayout::full;
  CacheSpec padded = with_v_dim(paged(DType::bf16, 2, 1, 576, 16, 6, {90, 47}), 512, true);
  padded.key_start = {10, 0};
  AttendCase modified = attend(padded, 16, 2);
  modified.mods = mods;
  modified.q_offset = {60, 40};
  for (int splits : {1, 3}) {
    modified.num_splits = splits;
    EXPECT_TRUE(check_attend(ctx, modified, Path::fused));
  }
}

// The split-KV kernels hold up to 256 columns of K and of V, the latent kernel (576, 512) with V a
// view of K: with V in a pool of its own the fused path names both head dims and where they run;
// nothing is written.
TEST(KvCacheHeadDims, FusedNamesItsBound) {
  Context ctx;
  std::mt19937_64 rng = rng_for("fused bound");
  const TestCache cache = make_cache(ctx, with_v_dim(paged(DType::bf16, 1, 1, 576, 16, 1, {9}), 512), rng);
  Tensor q = random_tensor(ctx, DType::bf16, 1, 16, 1, 576, rng, kQueryLayout);
  const Output out = poisoned_output(ctx, DType::bf16, 1, 16, 1, 512, kOutLayout);
  const std::vector<unsigned char> before = out.device.to_host();
  KvAttentionOptions options;
  options.path = Path::fused;
  try {
    attention_with_kv_cache(ctx, q.view, cache.view, out.view, options);
    ADD_FAILURE() << "the fused path took head dims (576, 512)";
  } catch (const NotAvailable& e) {
    EXPECT_NE(std::string(e.what()).find("attention_with_kv_cache: path fused: the split-KV kernels take head_dim and "
                                         "head_dim_v up to 256, got (576, 512), and the latent kernel (576, 512) with "
                                         "V a view of K's leading columns"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(out.device.to_host(), before);
}

}  // namespace
}  // namespace selfattn
