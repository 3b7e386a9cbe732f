// The one random generator (kernels/common/philox.cuh) and the dropout rule built on it
// (kernels/common/dropout.cuh), on the host: Philox4x32-10 against the known-answer vectors that
// Random123 publishes for philox4x32_10 (kat_vectors; cuRAND's Philox4_32_10 is the same
// function), then the keep/drop rule: threshold, coordinates, reference::dropout_keep_mask, and the
// keep rate over a large mask.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/dropout.cuh"
#include "kernels/common/philox.cuh"
#include "selfattn/reference.h"

namespace selfattn {
namespace {

namespace k = kernels::sim_target;

struct KnownAnswer {
  uint32_t counter[4], key[2], result[4];
};

// Random123 1.14, examples/kat_vectors, the three philox4x32 10 lines: zeros, all ones, and the
// digits of pi as counter and key.
constexpr KnownAnswer kPhilox4x32_10[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000}, {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

TEST(Philox, KnownAnswerVectors) {
  for (const KnownAnswer& v : kPhilox4x32_10) {
    const k::Philox4x32 counter{{v.counter[0], v.counter[1], v.counter[2], v.counter[3]}};
    const k::Philox4x32 got = k::philox4x32_10(counter, v.key[0], v.key[1]);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(got.word[w], v.result[w]) << "word " << w << " of counter " << v.counter[0];
  }
}

// floor(p * 2^32): 0 drops nothing, 0.5 half the words, and p just below 1 all but a few.
TEST(Dropout, Threshold) {
  EXPECT_EQ(k::dropout_threshold(0.0), 0u);
  EXPECT_EQ(k::dropout_threshold(0.5), 0x80000000u);
  EXPECT_EQ(k::dropout_threshold(0.25), 0x40000000u);
  EXPECT_EQ(k::dropout_threshold(double(0.99999994f)), uint32_t(double(0.99999994f) * 4294967296.0));
  EXPECT_EQ(k::dropout_threshold(1e-12), 0u);
}

// The rule of dropout.cuh, spelled out once more here from its documentation: key (seed low, high),
// counter (key / 4, row, offset + stream as 64 bits), word key % 4, kept when >= threshold.
TEST(Dropout, KeepIsTheDocumentedPhiloxWord) {
  const uint64_t seed = 0x0123456789abcdefull, offset = 0xfffffffffull;  // the sum carries into the high word
  const uint32_t threshold = k::dropout_threshold(0.5);
  int kept = 0;
  for (uint32_t stream : {0u, 1u, 77u}) {
    for (int row = 0; row < 9; ++row) {
      for (int key = 0; key < 13; ++key) {
        const uint64_t base = offset + stream;
        const k::Philox4x32 words = k::philox4x32_10(
            k::Philox4x32{{uint32_t(key) / 4, uint32_t(row), uint32_t(base & 0xffffffffu), uint32_t(base >> 32)}},
            0x89abcdefu, 0x01234567u);
        const bool want = words.word[key % 4] >= threshold;
        EXPECT_EQ(k::dropout_keep(seed, offset, threshold, stream, row, key), want);
        kept += want;
      }
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, 3 * 9 * 13);
}

// reference::dropout_keep_mask: element (b, h, i, j) from stream (first_batch + b) * heads + h, so a
// varlen sequence's mask alone is the same as its slice of a padded call's; another seed or offset
// gives another mask; p = 0 keeps everything.
TEST(Dropout, KeepMaskCoordinates) {
  const int batch = 3, heads = 2, seq_q = 5, seq_k = 7;
  const std::vector<uint8_t> all = reference::dropout_keep_mask(0.4, 9, 3, batch, heads, seq_q, seq_k);
  const std::vector<uint8_t> third = reference::dropout_keep_mask(0.4, 9, 3, 1, heads, seq_q, seq_k, /*first_batch=*/2);
  const size_t per_batch = size_t(heads) * seq_q * seq_k;
  EXPECT_EQ(third, std::vector<uint8_t>(all.begin() + long(2 * per_batch), all.end()));
  size_t at = 0;
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < seq_q; ++i)
        for (int j = 0; j < seq_k; ++j, ++at)
          ASSERT_EQ(all[at], k::dropout_keep(9, 3, k::dropout_threshold(0.4), uint32_t(b * heads + h), i, j));
  EXPECT_NE(all, reference::dropout_keep_mask(0.4, 10, 3, batch, heads, seq_q, seq_k));
  EXPECT_NE(all, reference::dropout_keep_mask(0.4, 9, 4, batch, heads, seq_q, seq_k));
  EXPECT_EQ(reference::dropout_keep_mask(0.0, 9, 3, batch, heads, seq_q, seq_k), std::vector<uint8_t>(all.size(), 1));
}

// Over 2^22 elements the keep rate is within 5 standard deviations of 1 - p, for rates from 1% to 99%.
TEST(Dropout, KeepRate) {
  for (const double p : {0.01, 0.1, 0.5, 0.9, 0.99}) {
    const std::vector<uint8_t> mask = reference::dropout_keep_mask(p, 31337, 0, 4, 8, 256, 512);
    double kept = 0;
    for (uint8_t m : mask) kept += m;
    const double n = double(mask.size());
    EXPECT_NEAR(kept / n, 1.0 - p, 5 * std::sqrt(p * (1 - p) / n)) << "p " << p;
  }
}

}  // namespace
}  // namespace selfattn
