// GPU twin of test_kv_cache: attention over paged and contiguous caches on every path, split counts
// on the fused path, score modifiers, and larger decode shapes (thousands of cached tokens, many splits) through the
// cuda backend (the nvcc build of kernels/decode/). Skips, saying why, where no GPU is usable.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "kv_cache_check.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using namespace kv_test;
using testing::cuda_context;

TEST(KvCacheGpu, PagedAndContiguousEveryPath) {
  std::string reason;
  std::optional<Context> ctx = cuda_context(reason);
  if (!ctx) GTEST_SKIP() << reason;
  const std::vector<AttendCase> cases = {
      attend(paged(DType::f32, 5, 1, 64, 16, 3, {0, 1, 15, 16, 17}), 4, 1),
      attend(paged(DType::f16, 5, 1, 128, 16, 3, {17, 16, 15, 1, 0}, false), 8, 7),
      attend(paged(DType::bf16, 4, 2, 64, 1, 20, {0, 1, 2, 19}), 2, 7),
      attend(paged(DType::f16, 4, 2, 64, 256, 2, {255, 256, 257, 1}, false), 8, 1),
      attend(paged(DType::bf16, 2, 1, 256, 16, 2, {9, 31}), 2, 3, Causal::none),
      attend(contiguous(DType::f16, 3, 2, 128, 40, {0, 33, 40}, false), 4, 7, Causal::none),
  };
  for (const AttendCase& c : cases)
    for (Path path : {Path::naive, Path::cublas, Path::fused}) EXPECT_TRUE(check_attend(*ctx, c, path));
}

// Decode-sized caches: 1 and 4 new rows, GQA 4 and 8, d 128, splits automatic and forced.
TEST(KvCacheGpu, LargerDecodeSplitCounts) {
  std::string reason;
  std::optional<Context> ctx = cuda_context(reason);
  if (!ctx) GTEST_SKIP() << reason;
  for (int splits : {0, 1, 7, 200}) {
    for (DType dtype : {DType::bf16, DType::f16}) {
      AttendCase c = attend(paged(dtype, 6, 2, 128, 16, 200, {0, 1, 1000, 3199, 3200, 2047}, false), 8, 1);
      c.num_splits = splits;
      EXPECT_TRUE(check_attend(*ctx, c, Path::fused));
      AttendCase spec = attend(paged(dtype, 3, 1, 128, 64, 40, {2500, 63, 64}), 8, 4);
      spec.num_splits = splits;
      EXPECT_TRUE(check_attend(*ctx, spec, Path::fused));
    }
  }
}

// Masks and score modifiers over decode-sized caches: a window of 256 over 3200 tokens (the
// split-KV kernel reads only its tiles), softcap, ALiBi and a bias with -inf columns, alone and
// together, every path, splits automatic and forced.
TEST(KvCacheGpu, ScoreModsEveryPath) {
  std::string reason;
  std::optional<Context> ctx = cuda_context(reason);
  if (!ctx) GTEST_SKIP() << reason;
  testing::ScoreModsCase window;
  window.window_left = 256;
  window.window_right = 0;
  testing::ScoreModsCase all = window;
  all.softcap = 30.0f;
  all.alibi = testing::AlibiSlopes::batch_heads;
  all.bias = testing::BiasLayout::heads;
  all.masked_key_period = 9;
  for (const testing::ScoreModsCase& mods : {window, all}) {
    for (int splits : {0, 7}) {
      AttendCase c = attend(paged(DType::bf16, 3, 2, 128, 16, 200, {3200, 255, 1000}, false), 8, 4);
      c.num_splits = splits;
      c.mods = mods;
      for (Path path : {Path::naive, Path::cublas, Path::fused}) EXPECT_TRUE(check_attend(*ctx, c, path));
      AttendCase f32 = attend(contiguous(DType::f32, 2, 1, 64, 700, {700, 300}, true), 4, 3, Causal::none);
      f32.num_splits = splits;
      f32.mods = mods;
      EXPECT_TRUE(check_attend(*ctx, f32, Path::fused));
    }
  }
}

// CUB's device scan behind cu_seqlens_from_lengths.
TEST(KvCacheGpu, CuSeqlensFromLengths) {
  std::string reason;
  std::optional<Context> ctx = cuda_context(reason);
  if (!ctx) GTEST_SKIP() << reason;
  std::vector<int32_t> lengths(1000), expected(1001, 0);
  for (size_t i = 0; i < lengths.size(); ++i) {
    lengths[i] = int32_t(i * 7 % 13);
    expected[i + 1] = expected[i] + lengths[i];
  }
  DeviceBuffer<int32_t> device_lengths(*ctx, lengths.size(), "lengths"), cu(*ctx, expected.size(), "cu_seqlens");
  device_lengths.copy_from_host(lengths);
  cu.fill_bytes(0xff);
  cu_seqlens_from_lengths(*ctx, device_lengths.data(), int(lengths.size()), cu.data());
  EXPECT_EQ(cu.to_host(), expected);
}

}  // namespace
}  // namespace selfattn
