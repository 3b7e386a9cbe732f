#pragma once
// The checks behind test_primitives_sim.cpp and test_primitives_gpu.cu: each runs one test kernel of
// primitive_test_kernels.cuh on a detail::Device (sim or cuda) and compares with plain host maths.
// `on_sim` enables what only the sim can promise: shared memory not yet written by a pending
// cp.async is still NaN (on a GPU that read is a race whose result is unspecified).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/device.h"
#include "primitive_test_kernels.cuh"

namespace selfattn::primitive_tests {

namespace kt = ::selfattn::kernels::primitive_tests;
using detail::Device;

// A device allocation filled from / read back into host vectors.
template <class T>
class DeviceArray {
 public:
  DeviceArray(Device& device, size_t count, const char* label)
      : device_(device), count_(count), data_(static_cast<T*>(device.allocate(count * sizeof(T), label))) {}
  DeviceArray(Device& device, const std::vector<T>& values, const char* label) : DeviceArray(device, values.size(), label) {
    device_.copy(data_, values.data(), count_ * sizeof(T), false);
  }
  ~DeviceArray() { device_.deallocate(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  // NaN bytes (0xFF..): an element the kernel failed to write stays NaN and fails the check.
  void poison() { device_.fill(data_, 0xff, count_ * sizeof(T)); }
  std::vector<T> read() {
    std::vector<T> host(count_);
    device_.synchronize();
    device_.copy(host.data(), data_, count_ * sizeof(T), false);
    return host;
  }
  T* get() const { return data_; }

 private:
  Device& device_;
  size_t count_;
  T* data_;
};

inline kernels::LaunchShape one_block(unsigned threads, size_t smem_bytes = 0) {
  return kernels::LaunchShape{dim3(1), dim3(threads), smem_bytes};
}

inline uint16_t to_bits(bool bf16, float x) {
  return bf16 ? __nv_bfloat16_raw(__float2bfloat16_rn(x)).x : __half_raw(__float2half_rn(x)).x;
}
inline float from_bits(bool bf16, uint16_t bits) {
  if (bf16) return __bfloat162float(__nv_bfloat16(__nv_bfloat16_raw{bits}));
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}
inline uint32_t pair(uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; }

// D = A B + C for `warps` independent tiles in one block, random inputs, against a double-precision
// product. Tolerance: (k+1) f32 roundings of the row's magnitude sum |c| + sum |a b| (the sim sums in
// k order; tensor cores order and round differently, within the same bound).
inline void check_mma(Device& device, int k, bool bf16, int warps, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> real(-3.f, 3.f);
  std::vector<uint16_t> a(size_t(warps) * 16 * k), b(size_t(warps) * k * 8);
  std::vector<float> c(size_t(warps) * 128);
  for (auto& x : a) x = to_bits(bf16, real(rng));
  for (auto& x : b) x = to_bits(bf16, real(rng));
  for (auto& x : c) x = real(rng);
  DeviceArray<uint16_t> da(device, a, "mma a"), db(device, b, "mma b");
  DeviceArray<float> dc(device, c, "mma c"), dd(device, c.size(), "mma d");
  dd.poison();
  const kt::MmaParams params{da.get(), db.get(), dc.get(), dd.get(), k, bf16};
  device.launch(kt::kernels().mma, one_block(32 * warps), &params);
  const std::vector<float> d = dd.read();
  for (int w = 0; w < warps; ++w)
    for (int row = 0; row < 16; ++row)
      for (int col = 0; col < 8; ++col) {
        double exact = c[w * 128 + row * 8 + col], magnitude = std::fabs(exact);
        for (int kk = 0; kk < k; ++kk) {
          const double product = double(from_bits(bf16, a[(w * 16 + row) * k + kk])) * from_bits(bf16, b[(w * k + kk) * 8 + col]);
          exact += product, magnitude += std::fabs(product);
        }
        const float got = d[w * 128 + row * 8 + col];
        ASSERT_FALSE(std::isnan(got)) << "warp " << w << " D(" << row << "," << col << ") not written";
        ASSERT_NEAR(got, exact, (k + 1) * 0x1p-24 * magnitude)
            << (bf16 ? "bf16" : "f16") << " k" << k << " warp " << w << " D(" << row << "," << col << ")";
      }
}

// Every lane's registers against the ISA's ldmatrix layout, for x1/x2/x4 with and without .trans.
inline void check_ldmatrix(Device& device, int count, bool transposed) {
  auto element = [](int m, int r, int c) { return uint16_t(1000 * (m + 1) + 10 * r + c); };
  std::vector<uint16_t> matrices(4 * 64);
  for (int i = 0; i < 4 * 64; ++i) matrices[i] = element(i / 64, i / 8 % 8, i % 8);
  DeviceArray<uint16_t> dm(device, matrices, "ldmatrix matrices");
  DeviceArray<uint32_t> dr(device, 32 * 4, "ldmatrix regs");
  dr.poison();
  const kt::LdmatrixParams params{dm.get(), dr.get(), count, transposed};
  const size_t smem = size_t(kt::ldmatrix_row_offset(0, 7) + 8) * sizeof(uint16_t);
  device.launch(kt::kernels().ldmatrix, one_block(32, smem), &params);
  const std::vector<uint32_t> regs = dr.read();
  for (int lane = 0; lane < 32; ++lane)
    for (int m = 0; m < 4; ++m) {
      const uint32_t got = regs[lane * 4 + m];
      if (m >= count) {
        ASSERT_EQ(got, 0u) << "lane " << lane << " register " << m << " beyond .x" << count;
        continue;
      }
      const int r = transposed ? 2 * (lane % 4) : lane / 4, c = transposed ? lane / 4 : 2 * (lane % 4);
      const uint32_t expected = transposed ? pair(element(m, r, c), element(m, r + 1, c)) : pair(element(m, r, c), element(m, r, c + 1));
      ASSERT_EQ(got, expected) << ".x" << count << (transposed ? ".trans" : "") << " lane " << lane << " matrix " << m;
    }
}

// cp.async -> ldmatrix -> mma on one 16x16x8 tile, B stored k-major (ldmatrix .trans) or n-major.
inline void check_tile_gemm(Device& device, bool bf16, bool b_n_major, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> real(-1.f, 1.f);
  std::vector<uint16_t> a(256), b(128);
  for (auto& x : a) x = to_bits(bf16, real(rng));
  for (auto& x : b) x = to_bits(bf16, real(rng));
  DeviceArray<uint16_t> da(device, a, "tile a"), db(device, b, "tile b");
  DeviceArray<float> dd(device, 128, "tile d");
  dd.poison();
  const kt::TileGemmParams params{da.get(), db.get(), dd.get(), bf16, b_n_major};
  device.launch(kt::kernels().tile_gemm, one_block(32, (16 + 16) * kt::kTileRowStride * sizeof(uint16_t)), &params);
  const std::vector<float> d = dd.read();
  for (int row = 0; row < 16; ++row)
    for (int col = 0; col < 8; ++col) {
      double exact = 0, magnitude = 0;
      for (int kk = 0; kk < 16; ++kk) {
        const uint16_t bk = b_n_major ? b[col * 16 + kk] : b[kk * 8 + col];
        const double product = double(from_bits(bf16, a[row * 16 + kk])) * from_bits(bf16, bk);
        exact += product, magnitude += std::fabs(product);
      }
      const float got = d[row * 8 + col];
      ASSERT_FALSE(std::isnan(got)) << "D(" << row << "," << col << ") not written";
      ASSERT_NEAR(got, exact, 17 * 0x1p-24 * magnitude) << "D(" << row << "," << col << ")";
    }
}

// What each thread sees of its own cp.async regions after each wait (see cp_async_kernel).
inline void check_cp_async_groups(Device& device, int threads, bool on_sim) {
  std::vector<float> source(size_t(4) * threads * 4);
  for (size_t i = 0; i < source.size(); ++i) source[i] = float(i + 1);
  DeviceArray<float> ds(device, source, "cp.async source");
  DeviceArray<float> dsnap(device, size_t(kt::kCpAsyncSnapshots) * threads * 16, "cp.async snapshots");
  dsnap.poison();
  const kt::CpAsyncParams params{ds.get(), dsnap.get()};
  device.launch(kt::kernels().cp_async, one_block(threads, size_t(4) * threads * 16), &params);
  const std::vector<float> snap = dsnap.read();
  for (int tid = 0; tid < threads; ++tid) {
    auto src = [&](int r, int i) { return source[(size_t(r) * threads + tid) * 4 + i]; };
    // The value of region r, float i, once its copy has landed (zero-filled parts are 0).
    auto landed = [&](int r, int i) {
      if (r == 1 && i == 3) return 0.f;  // ca<8> with 4 source bytes
      if (r == 2 && i >= 2) return 0.f;  // ca<8> with src_bytes 0
      return src(r, i);
    };
    // Snapshot s: regions landed by then (groups 0..2 after waits 2, 1, 0; region 3 after wait_all).
    for (int s = 0; s < kt::kCpAsyncSnapshots; ++s)
      for (int r = 0; r < 4; ++r) {
        const bool done = r < 3 ? s >= r + 1 : s == 4;
        for (int i = 0; i < 4; ++i) {
          const float got = snap[(size_t(s) * threads + tid) * 16 + r * 4 + i];
          if (done) {
            ASSERT_EQ(got, landed(r, i)) << "thread " << tid << " snapshot " << s << " region " << r << " float " << i;
          } else if (on_sim) {
            ASSERT_TRUE(std::isnan(got)) << "thread " << tid << " snapshot " << s << " region " << r << " float " << i
                                         << ": a copy landed before the wait that covers it (" << got << ")";
          }
        }
      }
  }
}

// Warp reductions of widths 2..32 and a shuffle, against the host. Sums: the lanes of a group agree
// exactly and are within the rounding bound of the exact sum; maxima are exact.
inline void check_reductions(Device& device, int threads, int xor_mask, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> real(-50.f, 50.f);
  std::vector<float> in(threads);
  for (auto& x : in) x = real(rng);
  DeviceArray<float> din(device, in, "reduce in"), dout(device, size_t(kt::kReduceOutputs) * threads, "reduce out");
  dout.poison();
  const kt::ReduceParams params{din.get(), dout.get(), xor_mask};
  device.launch(kt::kernels().reduce, one_block(threads), &params);
  const std::vector<float> out = dout.read();
  for (int w = 0; w < 5; ++w) {
    const int width = 2 << w;
    for (int tid = 0; tid < threads; ++tid) {
      const int first = tid / width * width;
      double sum = 0, magnitude = 0;
      float max = -std::numeric_limits<float>::infinity();
      for (int l = first; l < first + width; ++l) sum += in[l], magnitude += std::fabs(in[l]), max = std::max(max, in[l]);
      const float got_sum = out[size_t(2 * w) * threads + tid], got_max = out[size_t(2 * w + 1) * threads + tid];
      ASSERT_EQ(got_sum, out[size_t(2 * w) * threads + first]) << "width " << width << ": lanes disagree, thread " << tid;
      ASSERT_NEAR(got_sum, sum, width * 0x1p-24 * magnitude) << "width " << width << " thread " << tid;
      ASSERT_EQ(got_max, max) << "width " << width << " thread " << tid;
    }
  }
  for (int tid = 0; tid < threads; ++tid)
    ASSERT_EQ(out[size_t(10) * threads + tid], in[(tid & ~31) | ((tid & 31) ^ xor_mask)]) << "shuffle_xor thread " << tid;
}

// pack2 / unpack2 against the toolkit's host conversions (round to nearest even), n values.
inline void check_packing(Device& device, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> real(-70000.f, 70000.f);  // past f16's range: inf
  std::vector<float> in(size_t(2) * n);
  for (auto& x : in) x = real(rng) * (rng() % 2 ? 1e-4f : 1.f);
  DeviceArray<float> din(device, in, "pack in"), dunpacked(device, size_t(4) * n, "unpacked");
  DeviceArray<uint32_t> dpacked(device, size_t(2) * n, "packed");
  dpacked.poison();
  dunpacked.poison();
  const kt::PackParams params{din.get(), dpacked.get(), dunpacked.get(), n};
  device.launch(kt::kernels().pack, kernels::LaunchShape{dim3((n + 63) / 64), dim3(64), 0}, &params);
  const std::vector<uint32_t> packed = dpacked.read();
  const std::vector<float> unpacked = dunpacked.read();
  for (int i = 0; i < n; ++i) {
    const float lo = in[2 * i], hi = in[2 * i + 1];
    ASSERT_EQ(packed[2 * i], pair(to_bits(false, lo), to_bits(false, hi))) << "half2 of " << lo << ", " << hi;
    ASSERT_EQ(packed[2 * i + 1], pair(to_bits(true, lo), to_bits(true, hi))) << "bf162 of " << lo << ", " << hi;
    ASSERT_EQ(unpacked[4 * i], from_bits(false, to_bits(false, lo)));
    ASSERT_EQ(unpacked[4 * i + 1], from_bits(false, to_bits(false, hi)));
    ASSERT_EQ(unpacked[4 * i + 2], from_bits(true, to_bits(true, lo)));
    ASSERT_EQ(unpacked[4 * i + 3], from_bits(true, to_bits(true, hi)));
  }
}

}  // namespace selfattn::primitive_tests
