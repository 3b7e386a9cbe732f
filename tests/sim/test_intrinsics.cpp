// compat.h's CUDA intrinsics on the sim, each against a plain computation of what CUDA documents.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/compat.h"
#include "sim_test_launch.h"

namespace sim = selfattn::sim;
using sim::testing::launch;

namespace {

// ---- shuffles -------------------------------------------------------------------------------------

enum class Mode { idx, up, down, bfly };

// What CUDA's programming guide says each shuffle reads, in its own words: lanes form segments of
// `width`; idx reads lane src % width of the segment; up / down read lane -/+ delta unless that
// leaves the segment; xor reads lane ^ mask unless that lands in a later segment. -1: own value.
int documented_source(Mode mode, int lane, int b, int width) {
  const int start = lane / width * width;
  switch (mode) {
    case Mode::idx: return start + ((b % width) + width) % width;
    case Mode::up: return lane - b >= start ? lane - b : lane;
    case Mode::down: return lane + b < start + width ? lane + b : lane;
    case Mode::bfly: return (lane ^ b) < start + width ? (lane ^ b) : lane;
  }
  return -1;
}

template <class T>
T lane_value(unsigned block, unsigned thread) {
  const double v = 1000.0 * block + thread + 0.25;
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half(float(thread) + 0.5f);  // exact in half for thread < 1024
  } else if constexpr (std::is_same_v<T, __half2>) {
    return __floats2half2_rn(float(thread), -float(thread));
  } else {
    return T(v);
  }
}

template <class T>
struct ShuffleParams {
  T* out;
  unsigned mask;
  int b;
  int width;
  Mode mode;
};

template <class T>
__global__ void shuffle_kernel(const ShuffleParams<T> p) {
  const unsigned t = threadIdx.x;
  if (!(p.mask >> (t % 32) & 1u)) return;  // lanes outside the mask do not take part
  const T v = lane_value<T>(blockIdx.x, t);
  T r = v;
  switch (p.mode) {
    case Mode::idx: r = __shfl_sync(p.mask, v, p.b, p.width); break;
    case Mode::up: r = __shfl_up_sync(p.mask, v, unsigned(p.b), p.width); break;
    case Mode::down: r = __shfl_down_sync(p.mask, v, unsigned(p.b), p.width); break;
    case Mode::bfly: r = __shfl_xor_sync(p.mask, v, p.b, p.width); break;
  }
  p.out[blockIdx.x * blockDim.x + t] = r;
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
T all_ones() {
  T v;
  std::memset(static_cast<void*>(&v), 0xFF, sizeof v);
  return v;
}

// Runs one shuffle over `blocks` x `threads` and checks every participating lane.
template <class T>
void check_shuffle(Mode mode, int b, int width, unsigned mask, unsigned threads) {
  const unsigned blocks = 2;
  std::vector<T> out(size_t(blocks) * threads, lane_value<T>(999, 999));
  launch<ShuffleParams<T>, shuffle_kernel<T>>("shuffle_kernel", dim3(blocks), dim3(threads),
                                              {out.data(), mask, b, width, mode});
  for (unsigned blk = 0; blk < blocks; ++blk) {
    for (unsigned t = 0; t < threads; ++t) {
      const int lane = int(t % 32);
      if (!(mask >> lane & 1u)) continue;
      const int src_lane = documented_source(mode, lane, b, width);
      const unsigned src_thread = t - unsigned(lane) + unsigned(src_lane);
      const bool src_present = (mask >> src_lane & 1u) && src_thread < threads;
      const T expected = src_present ? lane_value<T>(blk, src_thread) : all_ones<T>();
      ASSERT_TRUE(same_bits(out[size_t(blk) * threads + t], expected))
          << "mode " << int(mode) << " b " << b << " width " << width << " mask " << std::hex << mask << std::dec
          << " threads " << threads << " block " << blk << " thread " << t << " source lane " << src_lane;
    }
  }
}

template <class T>
void check_all_shuffles() {
  for (int width : {1, 2, 4, 8, 16, 32}) {
    for (int b : {0, 1, 3, 5, 16, 31}) {
      for (Mode mode : {Mode::idx, Mode::up, Mode::down, Mode::bfly}) {
        check_shuffle<T>(mode, b, width, 0xffffffffu, 64);
      }
    }
  }
  check_shuffle<T>(Mode::idx, -1, 32, 0xffffffffu, 32);  // srcLane is taken modulo width
  check_shuffle<T>(Mode::idx, 37, 8, 0xffffffffu, 32);
  // Partial masks and a partial last warp: sources outside either read as 0xFF bytes.
  check_shuffle<T>(Mode::bfly, 1, 32, 0x0000ffffu, 32);
  check_shuffle<T>(Mode::down, 2, 32, 0x55555555u, 32);
  check_shuffle<T>(Mode::idx, 3, 16, 0xffff0000u, 32);
  check_shuffle<T>(Mode::down, 1, 32, 0xffffffffu, 45);
  check_shuffle<T>(Mode::idx, 19, 32, 0xffffffffu, 7);
}

TEST(SimIntrinsics, ShufflesInt) { check_all_shuffles<int>(); }
TEST(SimIntrinsics, ShufflesUnsigned) { check_all_shuffles<unsigned>(); }
TEST(SimIntrinsics, ShufflesFloat) { check_all_shuffles<float>(); }
TEST(SimIntrinsics, ShufflesDouble) { check_all_shuffles<double>(); }
TEST(SimIntrinsics, ShufflesLongLong) { check_all_shuffles<long long>(); }
TEST(SimIntrinsics, ShufflesHalf) { check_all_shuffles<__half>(); }
TEST(SimIntrinsics, ShufflesHalf2) { check_all_shuffles<__half2>(); }

struct WidthParams {
  int width;
};

__global__ void shuffle_bad_width(const WidthParams p) { (void)__shfl_xor_sync(0xffffffffu, 1, 1, p.width); }

TEST(SimIntrinsics, ShuffleWidthMustBeAPowerOfTwo) {
  for (int width : {0, 3, 12, 33, 64}) {
    EXPECT_THROW((launch<WidthParams, shuffle_bad_width>("shuffle_bad_width", dim3(1), dim3(32), {width})), sim::Error)
        << width;
  }
}

// A butterfly reduction, the way kernels use shuffles: every lane ends with the warp's sum.
struct ReduceParams {
  const float* in;
  float* out;
};

__global__ void butterfly_sum(const ReduceParams p) {
  float v = p.in[threadIdx.x];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  p.out[threadIdx.x] = v;
}

TEST(SimIntrinsics, ButterflySum) {
  std::vector<float> in(128), out(128, NAN);
  for (int i = 0; i < 128; ++i) in[i] = float(i % 13) - 6.0f;  // small integers: exact in any order
  launch<ReduceParams, butterfly_sum>("butterfly_sum", dim3(1), dim3(128), {in.data(), out.data()});
  for (int w = 0; w < 4; ++w) {
    float sum = 0;
    for (int l = 0; l < 32; ++l) sum += in[32 * w + l];
    for (int l = 0; l < 32; ++l) ASSERT_EQ(out[32 * w + l], sum) << "warp " << w << " lane " << l;
  }
}

// ---- votes, reductions, activemask ------------------------------------------------------------

struct VoteParams {
  const int* predicate;
  const unsigned* mask;  // per warp
  unsigned* ballot;
  int* any;
  int* all;
  unsigned* sum;
  int* min;
  int* max;
};

__global__ void vote_kernel(const VoteParams p) {
  const unsigned t = threadIdx.x, mask = p.mask[t / 32];
  if (!(mask >> (t % 32) & 1u)) return;
  const int pred = p.predicate[t];
  p.ballot[t] = __ballot_sync(mask, pred);
  p.any[t] = __any_sync(mask, pred);
  p.all[t] = __all_sync(mask, pred);
  p.sum[t] = __reduce_add_sync(mask, unsigned(pred));
  p.min[t] = __reduce_min_sync(mask, pred - 50);
  p.max[t] = __reduce_max_sync(mask, pred - 50);
}

TEST(SimIntrinsics, VotesAndReductions) {
  std::mt19937 rng(3);
  const unsigned threads = 32 * 5;
  const std::vector<unsigned> masks = {0xffffffffu, 0x0000ffffu, 0x80000001u, 0x12345678u, 0xffffffffu};
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<int> pred(threads);
    for (int& v : pred) v = trial == 1 ? 1 : trial == 2 ? 0 : int(rng() % 100);
    std::vector<unsigned> ballot(threads, 7), sum(threads, 7);
    std::vector<int> any(threads, 7), all(threads, 7), mn(threads, 7), mx(threads, 7);
    launch<VoteParams, vote_kernel>("vote_kernel", dim3(1), dim3(threads),
                                    {pred.data(), masks.data(), ballot.data(), any.data(), all.data(), sum.data(),
                                     mn.data(), mx.data()});
    for (unsigned w = 0; w < 5; ++w) {
      unsigned expect_ballot = 0, expect_sum = 0;
      int expect_min = 1 << 30, expect_max = -(1 << 30);
      for (unsigned l = 0; l < 32; ++l) {
        if (!(masks[w] >> l & 1u)) continue;
        const int v = pred[32 * w + l];
        expect_ballot |= unsigned(v != 0) << l;
        expect_sum += unsigned(v);
        expect_min = std::min(expect_min, v - 50);
        expect_max = std::max(expect_max, v - 50);
      }
      for (unsigned l = 0; l < 32; ++l) {
        if (!(masks[w] >> l & 1u)) continue;
        const unsigned t = 32 * w + l;
        ASSERT_EQ(ballot[t], expect_ballot) << "warp " << w << " lane " << l;
        ASSERT_EQ(any[t], int(expect_ballot != 0));
        ASSERT_EQ(all[t], int(expect_ballot == masks[w]));
        ASSERT_EQ(sum[t], expect_sum);
        ASSERT_EQ(mn[t], expect_min);
        ASSERT_EQ(mx[t], expect_max);
      }
    }
  }
}

struct ActiveParams {
  unsigned* active;
};

__global__ void activemask_kernel(const ActiveParams p) {
  if (threadIdx.x % 32 < 4) return;  // exits in the first round, before anyone's second one
  // (An __activemask() here could still see some of them: the schedule decides, as divergence would.)
  const unsigned survivors = threadIdx.x < 32 ? 0xfffffff0u : 0x000000f0u;
  __syncwarp(survivors);
  const unsigned active = __activemask();
  __syncwarp(survivors);  // no survivor exits while another still asks
  p.active[threadIdx.x] = active;
}

TEST(SimIntrinsics, ActivemaskSeesAbsentAndExitedLanes) {
  std::vector<unsigned> active(40, 7);
  launch<ActiveParams, activemask_kernel>("activemask_kernel", dim3(1), dim3(40), {active.data()});
  for (unsigned t = 4; t < 32; ++t) EXPECT_EQ(active[t], 0xfffffff0u) << t;
  for (unsigned t = 36; t < 40; ++t) EXPECT_EQ(active[t], 0x000000f0u) << t;
}

// ---- block-wide votes ---------------------------------------------------------------------------

struct BlockVoteParams {
  const int* predicate;
  int* count;
  int* all;
  int* any;
};

__global__ void block_vote_kernel(const BlockVoteParams p) {
  const unsigned t = threadIdx.x + blockDim.x * threadIdx.y, n = blockDim.x * blockDim.y;
  const int* pred = p.predicate + blockIdx.x * n;
  const size_t slot = size_t(blockIdx.x) * n + t;
  p.count[slot] = __syncthreads_count(pred[t]);
  p.all[slot] = __syncthreads_and(pred[t]);
  p.any[slot] = __syncthreads_or(pred[t] * int(t % 2));  // only the odd threads' predicates count
}

TEST(SimIntrinsics, SyncthreadsCountAndOr) {
  std::mt19937 rng(9);
  const unsigned blocks = 5, nx = 113, ny = 2, n = nx * ny;
  std::vector<int> pred(blocks * n);
  for (unsigned b = 0; b < blocks; ++b) {
    for (unsigned t = 0; t < n; ++t) {
      // block 0: all true; block 1: all false; block 2: only thread 0 (even); others random.
      pred[b * n + t] = b == 0 ? 3 : b == 1 ? 0 : b == 2 ? int(t == 0) : int(rng() % 3 == 0) * -1;
    }
  }
  std::vector<int> count(pred.size(), -1), all(pred.size(), -1), any(pred.size(), -1);
  launch<BlockVoteParams, block_vote_kernel>("block_vote_kernel", dim3(blocks), dim3(nx, ny),
                                             {pred.data(), count.data(), all.data(), any.data()});
  for (unsigned b = 0; b < blocks; ++b) {
    int expect_count = 0, expect_odd_any = 0;
    for (unsigned t = 0; t < n; ++t) {
      expect_count += pred[b * n + t] != 0;
      expect_odd_any |= (t % 2) && pred[b * n + t] != 0;
    }
    for (unsigned t = 0; t < n; ++t) {
      ASSERT_EQ(count[b * n + t], expect_count) << "block " << b << " thread " << t;
      ASSERT_EQ(all[b * n + t], int(expect_count == int(n))) << "block " << b << " thread " << t;
      ASSERT_EQ(any[b * n + t], expect_odd_any) << "block " << b << " thread " << t;
    }
  }
}

__global__ void trap_kernel(const ActiveParams) {
  if (blockIdx.x == 1 && threadIdx.x == 9) __trap();
}

TEST(SimIntrinsics, TrapStopsTheLaunch) {
  try {
    launch<ActiveParams, trap_kernel>("trap_kernel", dim3(3), dim3(32), {nullptr});
    FAIL() << "no error";
  } catch (const sim::Error& e) {
    EXPECT_STREQ(e.what(), "sim: __trap() in block (1,0,0), thread (9,0,0)");
  }
}

// ---- atomics: many blocks on several workers ----------------------------------------------------

struct AtomicParams {
  const int* values;
  int n;
  int* int_sum;
  unsigned* unsigned_sum;
  unsigned long long* ull_sum;
  float* float_sum;
  double* double_sum;
  int* int_max;
  int* int_min;
  unsigned* unsigned_max;
  int* cas_counter;
  int* exch_count;  // how many threads saw each ticket handed out by atomicExch
};

__global__ void atomics_kernel(const AtomicParams p) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= p.n) return;
  const int v = p.values[i];
  atomicAdd(p.int_sum, v);
  atomicAdd(p.unsigned_sum, unsigned(v));
  atomicAdd(p.ull_sum, (unsigned long long)(v + 1000));
  atomicAdd(p.float_sum, float(v));  // integers below 2^24: exact in any order
  atomicAdd(p.double_sum, double(v) * 0.5);
  atomicMax(p.int_max, v);
  atomicMin(p.int_min, v);
  atomicMax(p.unsigned_max, unsigned(v + 1000));
  int old = *p.cas_counter, seen;
  while ((seen = atomicCAS(p.cas_counter, old, old + 1)) != old) old = seen;
  atomicAdd(&p.exch_count[atomicExch(p.cas_counter + 1, i) + 1], 1);
}

TEST(SimIntrinsics, AtomicsAcrossConcurrentBlocks) {
  sim::testing::ScopedOptions options(sim::testing::with_workers(4));
  const int n = 64 * 37 + 5;
  std::vector<int> values(n);
  std::mt19937 rng(5);
  for (int& v : values) v = int(rng() % 2001) - 1000;
  int int_sum = 0, int_max = -(1 << 30), int_min = 1 << 30, cas[2] = {0, -1};
  unsigned unsigned_sum = 0, unsigned_max = 0;
  unsigned long long ull_sum = 0;
  float float_sum = 0;
  double double_sum = 0;
  std::vector<int> exch_count(n + 1, 0);
  launch<AtomicParams, atomics_kernel>("atomics_kernel", dim3((n + 63) / 64), dim3(64),
                                       {values.data(), n, &int_sum, &unsigned_sum, &ull_sum, &float_sum, &double_sum,
                                        &int_max, &int_min, &unsigned_max, cas, exch_count.data()});
  long long sum = 0;
  int mx = values[0], mn = values[0];
  for (int v : values) sum += v, mx = std::max(mx, v), mn = std::min(mn, v);
  EXPECT_EQ(int_sum, sum);
  EXPECT_EQ(unsigned_sum, unsigned(sum));
  EXPECT_EQ(ull_sum, (unsigned long long)(sum + 1000LL * n));
  EXPECT_EQ(float_sum, float(sum));
  EXPECT_EQ(double_sum, double(sum) * 0.5);
  EXPECT_EQ(int_max, mx);
  EXPECT_EQ(int_min, mn);
  EXPECT_EQ(unsigned_max, unsigned(mx + 1000));
  EXPECT_EQ(cas[0], n);
  // atomicExch hands each previous holder to exactly one thread: the initial -1 and all i but one.
  int handed = 0;
  for (int c : exch_count) {
    ASSERT_LE(c, 1);
    handed += c;
  }
  EXPECT_EQ(handed, n);
  EXPECT_EQ(exch_count[0], 1);
}

// Each atomic's return value and effect, one call at a time (plain functions: no launch needed).
TEST(SimIntrinsics, AtomicsReturnTheOldValue) {
  int i = 10;
  EXPECT_EQ(atomicAdd(&i, 5), 10);
  EXPECT_EQ(atomicSub(&i, 3), 15);
  EXPECT_EQ(atomicExch(&i, 40), 12);
  EXPECT_EQ(atomicMax(&i, 30), 40);
  EXPECT_EQ(atomicMax(&i, 50), 40);
  EXPECT_EQ(atomicMin(&i, -7), 50);
  EXPECT_EQ(atomicCAS(&i, 0, 1), -7);  // no match: unchanged
  EXPECT_EQ(atomicCAS(&i, -7, 6), -7);
  EXPECT_EQ(atomicAnd(&i, 3), 6);
  EXPECT_EQ(atomicOr(&i, 8), 2);
  EXPECT_EQ(atomicXor(&i, 15), 10);
  EXPECT_EQ(i, 5);
  unsigned u = 0xfffffffeu;
  EXPECT_EQ(atomicAdd(&u, 3u), 0xfffffffeu);  // wraps
  EXPECT_EQ(u, 1u);
  EXPECT_EQ(atomicMax(&u, 0x80000000u), 1u);  // unsigned comparison
  EXPECT_EQ(u, 0x80000000u);
  unsigned long long ull = 1ull << 40;
  EXPECT_EQ(atomicAdd(&ull, 1ull), 1ull << 40);
  EXPECT_EQ(atomicCAS(&ull, (1ull << 40) + 1, 7ull), (1ull << 40) + 1);
  EXPECT_EQ(ull, 7ull);
  float f = 1.5f;
  EXPECT_EQ(atomicAdd(&f, 2.25f), 1.5f);
  EXPECT_EQ(atomicExch(&f, -1.0f), 3.75f);
  EXPECT_EQ(f, -1.0f);
  double d = 0.5;
  EXPECT_EQ(atomicAdd(&d, 0.25), 0.5);
  EXPECT_EQ(d, 0.75);
}

// ---- math (plain functions: no launch needed) -----------------------------------------------------

// The fast intrinsics carry the error CUDA documents for them (kernels/common/sim_math.h, each bound
// checked over many inputs by test_sim_math_bounds.cpp): here, within those bounds.
TEST(SimIntrinsics, Math) {
  for (float x : {-20.0f, -1.5f, 0.0f, 0.3f, 7.0f, 80.0f}) {
    const float ulp = std::exp(x) * 0x1p-23f;  // at least an ulp of e^x
    EXPECT_NEAR(__expf(x), std::exp(x), (2.5f + std::floor(std::fabs(1.173f * x))) * ulp);  // 2 + |1.173 x| ulp
    EXPECT_FLOAT_EQ(exp2f(x), std::exp2(x));  // outside the kernels' namespace: glibc's
    // exp2(x * __log2f(2)): __log2f's 2^-22, times x, carried through 2^(...)
    EXPECT_NEAR(__powf(2.0f, x), std::exp2(x), 0x1p-21f * (std::fabs(x) + 1) * std::exp2(x));
  }
  EXPECT_FLOAT_EQ(__logf(10.0f), std::log(10.0f));    // 3 ulp
  EXPECT_FLOAT_EQ(__log2f(10.0f), std::log2(10.0f));  // 2 ulp
  EXPECT_NEAR(__sinf(0.5f), std::sin(0.5f), 0x1p-21f);  // 2^-21.41
  EXPECT_NEAR(__cosf(0.5f), std::cos(0.5f), 0x1p-21f);  // 2^-21.19
  EXPECT_EQ(__expf(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isnan(__expf(NAN)));

  EXPECT_NEAR(__fdividef(3.0f, 4.0f), 0.75f, 2 * 0x1p-24f);  // 2 ulp
  EXPECT_EQ(__fdividef(1.0f, 0x1.8p126f), 0.0f);  // documented: 0 for 2^126 < |y| < 2^128
  EXPECT_TRUE(std::isnan(__fdividef(INFINITY, 0x1.8p126f)));
  EXPECT_EQ(__fdividef(1.0f, INFINITY), 0.0f);
  EXPECT_FLOAT_EQ(rsqrtf(4.0f), 0.5f);
  EXPECT_EQ(rsqrtf(0.0f), INFINITY);
  EXPECT_TRUE(std::isnan(rsqrtf(-1.0f)));
  EXPECT_EQ(__frcp_rn(4.0f), 0.25f);
  EXPECT_EQ(__saturatef(-2.0f), 0.0f);
  EXPECT_EQ(__saturatef(0.25f), 0.25f);
  EXPECT_EQ(__saturatef(3.0f), 1.0f);
  EXPECT_EQ(__saturatef(NAN), 0.0f);
  EXPECT_EQ(__float2int_rn(2.5f), 2);
  EXPECT_EQ(__float2int_rn(3.5f), 4);
  EXPECT_EQ(__float2int_rn(-2.5f), -2);
  EXPECT_EQ(__float2int_rz(-2.7f), -2);
  EXPECT_EQ(__fmaf_rn(2.0f, 3.0f, 1.0f), 7.0f);

  EXPECT_EQ(__float_as_uint(1.0f), 0x3f800000u);
  EXPECT_EQ(__float_as_int(-2.0f), int(0xc0000000u));
  EXPECT_EQ(__uint_as_float(0x3f800000u), 1.0f);
  EXPECT_EQ(__int_as_float(int(0xc0000000u)), -2.0f);
  EXPECT_TRUE(std::isnan(__uint_as_float(0xffffffffu)));

  EXPECT_EQ(__popc(0xf0f0u), 8);
  EXPECT_EQ(__clz(0), 32);
  EXPECT_EQ(__clz(1), 31);
  EXPECT_EQ(__clz(-1), 0);
  EXPECT_EQ(__ffs(0), 0);
  EXPECT_EQ(__ffs(8), 4);
  EXPECT_EQ(__brev(1u), 0x80000000u);
  EXPECT_EQ(__brev(0x12345678u), 0x1e6a2c48u);
  EXPECT_EQ(__umulhi(0xffffffffu, 0xffffffffu), 0xfffffffeu);
  EXPECT_EQ(__mulhi(-2, 0x40000000), -1);
  EXPECT_EQ(__umul64hi(~0ull, 4ull), 3ull);
  EXPECT_EQ(__popcll(~0ull), 64);
  EXPECT_EQ(__clzll(1), 63);
  EXPECT_EQ(__clzll(0), 64);
  EXPECT_EQ(__ffsll(1ll << 40), 41);

  float buffer[3] = {1.0f, 2.0f, 3.0f};
  EXPECT_EQ(__ldg(buffer + 2), 3.0f);
  EXPECT_EQ(__ldcs(buffer + 1), 2.0f);
  __stcs(buffer, 5.0f);
  EXPECT_EQ(buffer[0], 5.0f);

  EXPECT_EQ(__byte_perm(0x33221100u, 0x77665544u, 0x5410u), 0x55441100u);  // the low halves
  EXPECT_EQ(__byte_perm(0x33221100u, 0x77665544u, 0x7632u), 0x77663322u);  // the high halves
  EXPECT_EQ(__byte_perm(0x33221100u, 0x77665544u, 0x0123u), 0x00112233u);  // a byte swap
  EXPECT_EQ(__funnelshift_l(0x80000000u, 1u, 1u), 3u);
  EXPECT_EQ(__funnelshift_l(0x80000000u, 1u, 33u), 3u);   // wraps: n & 31
  EXPECT_EQ(__funnelshift_lc(0x80000000u, 1u, 40u), 0x80000000u);  // clamps to 32: lo
  EXPECT_EQ(__funnelshift_r(2u, 1u, 1u), 0x80000001u);
  EXPECT_EQ(__funnelshift_rc(2u, 1u, 40u), 1u);  // clamps to 32: hi

  EXPECT_EQ(min(3, -4), -4);
  EXPECT_EQ(max(3u, 4u), 4u);
  EXPECT_EQ(min(2.5f, 1.5f), 1.5f);
  EXPECT_EQ(max(2.5, 1.5), 2.5);
  EXPECT_EQ(max(-1, 2u), 0xffffffffu);  // CUDA's mixed overload: both converted to unsigned
  EXPECT_EQ(min(int64_t(-5), 3), int64_t(-5));
  EXPECT_EQ(max(1.0f, NAN), 1.0f);  // fmaxf: NaN only when both are
  EXPECT_EQ(warpSize, 32);
}

}  // namespace
