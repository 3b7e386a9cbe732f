// The reference's KV-cache semantics (selfattn/reference.h): paged gather, append across pages,
// rotary in both conventions, merge_states. Hand-computed where small, otherwise checked against
// the plain reference::attention on the same keys laid out densely.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "selfattn/reference.h"

namespace selfattn::reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One kv head, head_dim 1, page size 2, pages in the order 3, 0, 2 for the one sequence.
KvCacheImage tiny_cache(int length) {
  KvCacheImage c;
  c.batch = 1;
  c.kv_heads = 1;
  c.head_dim = 1;
  c.num_pages = 4;
  c.page_size = 2;
  c.max_pages_per_seq = 3;
  c.k.assign(8, 0.0);
  c.v.assign(8, 0.0);
  c.block_table = {3, 0, 2};
  c.lengths = {length};
  return c;
}

TEST(KvCacheReference, AppendCrossesPagesInBlockTableOrder) {
  KvCacheImage c = tiny_cache(1);
  // Tokens at positions 1, 2, 3: page 3 row 1, then page 0 rows 0 and 1.
  append_kv(c, {10, 11, 12}, {20, 21, 22}, 3);
  EXPECT_EQ(c.k, (std::vector<double>{11, 12, 0, 0, 0, 0, 0, 10}));
  EXPECT_EQ(c.v, (std::vector<double>{21, 22, 0, 0, 0, 0, 0, 20}));
  EXPECT_EQ(c.lengths[0], 1);  // lengths are the caller's to advance
}

TEST(KvCacheReference, AppendDropsTokensPastCapacityOrInBadPages) {
  KvCacheImage c = tiny_cache(5);
  append_kv(c, {1, 2, 3}, {4, 5, 6}, 3);  // position 5 -> page 2 row 1; 6 and 7 past capacity 6
  EXPECT_EQ(c.k, (std::vector<double>{0, 0, 0, 0, 0, 1, 0, 0}));
  KvCacheImage bad = tiny_cache(0);
  bad.block_table = {-1, 9, 2};
  append_kv(bad, {1, 2, 3}, {4, 5, 6}, 3);  // pages -1 and 9 do not exist: only nothing is written
  EXPECT_EQ(bad.k, std::vector<double>(8, 0.0));
}

TEST(KvCacheReference, RotaryConventions) {
  // cos 0, sin 1 (a quarter turn) for both pairs at position 1; position 0 is the identity.
  RotaryTable r;
  r.max_position = 2;
  r.rotary_dim = 4;
  r.cos = {1, 1, 0, 0};
  r.sin = {0, 0, 1, 1};
  std::vector<double> x = {1, 2, 3, 4, 5};
  r.interleaved = true;  // pairs (0,1), (2,3): (a, b) -> (-b, a)
  rotate_row(x.data(), 5, 1, r);
  EXPECT_EQ(x, (std::vector<double>{-2, 1, -4, 3, 5}));
  x = {1, 2, 3, 4, 5};
  r.interleaved = false;  // pairs (0,2), (1,3)
  rotate_row(x.data(), 5, 1, r);
  EXPECT_EQ(x, (std::vector<double>{-3, -4, 1, 2, 5}));
  x = {1, 2, 3, 4, 5};
  rotate_row(x.data(), 5, 0, r);
  EXPECT_EQ(x, (std::vector<double>{1, 2, 3, 4, 5}));
  rotate_row(x.data(), 5, 7, r);  // past the table: the last row
  EXPECT_EQ(x, (std::vector<double>{-3, -4, 1, 2, 5}));
}

// A paged cache with shuffled pages attends exactly like attention() on the same keys laid out
// densely with key_lengths and the bottom-right mask.
TEST(KvCacheReference, PagedAttentionEqualsDenseAttention) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> uniform(-1, 1);
  KvCacheImage c;
  c.batch = 3;
  c.kv_heads = 2;
  c.head_dim = 5;
  c.page_size = 3;
  c.max_pages_per_seq = 4;
  c.num_pages = 13;
  c.block_table = {7, 2, 11, 0, 5, 12, 1, 3, 9, 4, 6, 8};
  c.lengths = {0, 7, 12};
  c.k.resize(size_t(c.num_pages) * c.kv_heads * c.page_size * c.head_dim);
  c.v.resize(c.k.size());
  for (double& x : c.k) x = uniform(rng);
  for (double& x : c.v) x = uniform(rng);
  Problem p;
  p.batch = 3;
  p.heads = 4;
  p.kv_heads = 2;
  p.seq_q = 3;
  p.seq_k = 12;
  p.head_dim = 5;
  p.causal = Causal::bottom_right;
  p.key_lengths = c.lengths;
  std::vector<double> q(size_t(p.batch) * p.heads * p.seq_q * p.head_dim);
  for (double& x : q) x = uniform(rng);
  // Dense [batch, kv_heads, 12, d] from the block table by hand.
  std::vector<double> k(size_t(p.batch) * p.kv_heads * p.seq_k * p.head_dim, 0.0), v(k.size(), 0.0);
  for (int b = 0; b < 3; ++b)
    for (int h = 0; h < 2; ++h)
      for (int t = 0; t < c.lengths[size_t(b)]; ++t)
        for (int e = 0; e < 5; ++e) {
          const int page = c.block_table[size_t(b) * 4 + size_t(t / 3)];
          const size_t from = ((size_t(page) * 2 + h) * 3 + size_t(t % 3)) * 5 + size_t(e);
          const size_t to = ((size_t(b) * 2 + h) * 12 + size_t(t)) * 5 + size_t(e);
          k[to] = c.k[from];
          v[to] = c.v[from];
        }
  const Result dense = attention(p, q, k, v);
  const Result paged = attention_with_kv_cache(p, q, c);
  ASSERT_EQ(dense.out.size(), paged.out.size());
  for (size_t i = 0; i < dense.out.size(); ++i) EXPECT_NEAR(dense.out[i], paged.out[i], 1e-14) << i;
  for (size_t i = 0; i < dense.lse.size(); ++i) {
    if (std::isinf(dense.lse[i])) EXPECT_EQ(paged.lse[i], -kInf) << i;
    else EXPECT_NEAR(dense.lse[i], paged.lse[i], 1e-14) << i;
  }
}

// Attention over keys [0, 4) merged with attention over [4, 10) is attention over [0, 10).
TEST(KvCacheReference, MergeStatesOfDisjointKeysIsTheUnion) {
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<double> uniform(-2, 2);
  const int seq_q = 3, d = 4, split = 4, n = 10;
  std::vector<double> q(size_t(seq_q) * d), k(size_t(n) * d), v(k.size());
  for (double& x : q) x = uniform(rng);
  for (double& x : k) x = uniform(rng);
  for (double& x : v) x = uniform(rng);
  Problem p;
  p.seq_q = seq_q;
  p.head_dim = d;
  p.seq_k = n;
  const Result whole = attention(p, q, k, v);
  p.seq_k = split;
  const Result a = attention(p, q, std::vector<double>(k.begin(), k.begin() + split * d),
                             std::vector<double>(v.begin(), v.begin() + split * d));
  p.seq_k = n - split;
  const Result b = attention(p, q, std::vector<double>(k.begin() + split * d, k.end()),
                             std::vector<double>(v.begin() + split * d, v.end()));
  const Result merged = merge_states(a, b, d);
  for (size_t i = 0; i < whole.out.size(); ++i) EXPECT_NEAR(whole.out[i], merged.out[i], 1e-12) << i;
  for (size_t i = 0; i < whole.lse.size(); ++i) EXPECT_NEAR(whole.lse[i], merged.lse[i], 1e-12) << i;
  // Both sides empty: 0 and -inf; one side empty: the other side unchanged.
  Result empty;
  empty.out.assign(whole.out.size(), 0.0);
  empty.lse.assign(whole.lse.size(), -kInf);
  const Result nothing = merge_states(empty, empty, d);
  EXPECT_EQ(nothing.out, empty.out);
  EXPECT_EQ(nothing.lse, empty.lse);
  const Result same = merge_states(empty, whole, d);
  for (size_t i = 0; i < whole.out.size(); ++i) EXPECT_NEAR(whole.out[i], same.out[i], 1e-15) << i;
}

}  // namespace
}  // namespace selfattn::reference
