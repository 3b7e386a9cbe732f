// The split-KV decode's automatic split count (split_heuristic.h) as the sim plans it: the SM count
// comes from the Device (the sim reports kSimMultiprocessors), and the count fills two waves of
// it unless the cache is too short to give each split four 32-key tiles, or the splits' partials
// would add more than an eighth to the cache's bytes while fewer splits still fill one wave.
#include <gtest/gtest.h>

#include "runtime/context_state.h"
#include "selfattn/selfattn.h"
#include "kv_cache/split_heuristic.h"

namespace selfattn {
namespace {

using detail::choose_splits;

TEST(SplitHeuristic, TheSimReportsItsDocumentedMultiprocessorCount) {
  Context ctx(Backend::sim);
  EXPECT_EQ(ctx.state().device->multiprocessor_count(), detail::kSimMultiprocessors);
  EXPECT_EQ(detail::kSimMultiprocessors, 132);
}

TEST(SplitHeuristic, FillsTwoWavesOfTheSimsMultiprocessors) {
  Context ctx(Backend::sim);
  const int sms = ctx.state().device->multiprocessor_count();
  // One (sequence, kv head) block and a long cache: 264 wanted, capped at 64.
  EXPECT_EQ(choose_splits(0, 1, 32768, sms), 64);
  // 8 blocks: ceil(264 / 8) = 33 wanted, but 4096 keys are 128 tiles, at most 32 splits of 4.
  EXPECT_EQ(choose_splits(0, 8, 4096, sms), 32);
  // 8 blocks over 16384 keys: the 33 wanted fit (512 tiles allow 128).
  EXPECT_EQ(choose_splits(0, 8, 16384, sms), 33);
  // 7 blocks: ceil(264 / 7) = 38.
  EXPECT_EQ(choose_splits(0, 7, 16384, sms), 38);
  // Two waves already without splitting: 1.
  EXPECT_EQ(choose_splits(0, 264, 32768, sms), 1);
  EXPECT_EQ(choose_splits(0, 1000, 32768, sms), 1);
  // A cache of 113 keys (4 tiles) or of 1 key: one split, whatever the grid.
  EXPECT_EQ(choose_splits(0, 1, 113, sms), 1);
  EXPECT_EQ(choose_splits(0, 1, 1, sms), 1);
  // 1000 keys: 32 tiles, at most 8 splits.
  EXPECT_EQ(choose_splits(0, 2, 1000, sms), 8);
}

// The partials' bytes against the cache's: each split adds its fp32 partial O and LSE (written,
// then read back by decode_combine) for the block's rows.
TEST(SplitHeuristic, KeepsThePartialsWithinAnEighthOfTheCacheWhileEverySmHasABlock) {
  Context ctx(Backend::sim);
  const int sms = ctx.state().device->multiprocessor_count();
  // DeepSeek's latent cache (1152 bytes a key, V read with K), 16 heads x 1 row of 512 columns per
  // block, 16 sequences of 4096 keys: two waves want 17 splits, an eighth of the cache allows 8
  // (4718592 / (8 x 65664)), and 9 keep every SM busy (16 x 9 = 144 >= 132 blocks).
  const detail::SplitBytes latent{4096 * 1152, 2 * 16 * 513 * 4};
  EXPECT_EQ(choose_splits(0, 16, 4096, sms), 17);
  EXPECT_EQ(choose_splits(0, 16, 4096, sms, latent), 9);
  // 64 sequences: two waves need 5, within the share.
  EXPECT_EQ(choose_splits(0, 64, 4096, sms, latent), 5);
  // 4 sequences: one wave needs 33, the tiles allow 32; the share does not cut below a wave.
  EXPECT_EQ(choose_splits(0, 4, 4096, sms, latent), 32);
  // 32k keys: the share allows 71, more than the two waves' 17.
  EXPECT_EQ(choose_splits(0, 16, 32768, sms, {int64_t(32768) * 1152, 2 * 16 * 513 * 4}), 17);
  // GQA 4 at head dim 128 (512 bytes a key, 4 rows of 128 per block): never cut at 4096 keys.
  EXPECT_EQ(choose_splits(0, 8, 4096, sms, {4096 * 512, 2 * 4 * 129 * 4}), 32);
  // The override stays as given.
  EXPECT_EQ(choose_splits(17, 16, 4096, sms, latent), 17);
}

TEST(SplitHeuristic, FollowsTheMultiprocessorCountAndTheOverride) {
  // A smaller GPU wants fewer splits for the same work: 2 * 16 SMs over one block.
  EXPECT_EQ(choose_splits(0, 1, 32768, 16), 32);
  EXPECT_EQ(choose_splits(0, 3, 32768, 16), 11);
  EXPECT_EQ(choose_splits(0, 3, 32768, 1), 1);
  // options.num_splits wins as given (the caller clamps it to the grid).
  EXPECT_EQ(choose_splits(3, 1, 32768, 132), 3);
  EXPECT_EQ(choose_splits(4096, 1, 1, 132), 4096);
}

}  // namespace
}  // namespace selfattn
