#pragma once
// The checks behind test_hopper_primitives_sim.cpp and test_hopper_primitives_gpu.cu: each runs one
// kernel of hopper_test_kernels.cuh on a detail::Device (sim or cuda) and compares with the host.
// Every wgmma is checked against the project's mma.sync primitives run in the same launch on the
// same shared memory, and both against a double-precision host product.
// `on_sim` enables what only the sim can promise: accumulators read before wgmma_wait are NaN, a
// TMA destination read before its barrier wait is reported (on a GPU both are races whose result
// is unspecified).
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "hopper_test_kernels.cuh"
#include "primitive_checks.h"
#include "selfattn/error.h"

namespace selfattn::primitive_tests {

namespace kh = ::selfattn::kernels::hopper_tests;

// A 4-D tensor (columns, rows, heads, batch), BSHD-like: rows are the outer stride, heads are
// padded (row pitch heads * (cols + pad)), batches have a gap. Random 16-bit values everywhere,
// padding included (a copy that strays into it shows).
struct Tensor4 {
  bool bf16 = true;
  int64_t dims[4] = {};
  int64_t strides[4] = {};  // elements
  std::vector<uint16_t> host;

  Tensor4(bool bf16_, int cols, int rows, int heads, int batch, int pad, std::mt19937& rng, float lo = -3.f,
          float hi = 3.f)
      : bf16(bf16_) {
    dims[0] = cols, dims[1] = rows, dims[2] = heads, dims[3] = batch;
    strides[0] = 1;
    strides[2] = cols + pad;
    strides[1] = int64_t(heads) * strides[2];
    strides[3] = int64_t(rows) * strides[1] + 24;  // a gap between batches (16-byte multiple)
    host.resize(size_t(batch * strides[3]));
    std::uniform_real_distribution<float> real(lo, hi);
    for (auto& x : host) x = to_bits(bf16, real(rng));
  }
  bool inside(int64_t c, int64_t r, int64_t h, int64_t b) const {
    return c >= 0 && c < dims[0] && r >= 0 && r < dims[1] && h >= 0 && h < dims[2] && b >= 0 && b < dims[3];
  }
  // The element TMA delivers for these coordinates: the tensor's, or 0 out of bounds.
  uint16_t at(int64_t c, int64_t r, int64_t h, int64_t b) const {
    return inside(c, r, h, b) ? host[size_t(c + r * strides[1] + h * strides[2] + b * strides[3])] : uint16_t(0);
  }
  // cuTensorMapEncodeTiled's arguments for boxes of 64 columns x box_rows rows, 128-byte swizzle.
  kernels::TmaTiledSpec spec(const void* device_base, int box_rows) const {
    kernels::TmaTiledSpec s;
    s.base = device_base;
    s.rank = 4;
    s.element_bytes = 2;
    for (int i = 0; i < 4; ++i) {
      s.dims[i] = uint64_t(dims[i]);
      s.strides_bytes[i] = uint64_t(strides[i] * 2);
    }
    s.box[0] = 64, s.box[1] = uint32_t(box_rows), s.box[2] = 1, s.box[3] = 1;
    s.swizzle = kernels::TmaSwizzle::b128;
    return s;
  }
};

inline void encode(Device& device, kernels::TmaDescriptor* map, const Tensor4& t, const void* base, int box_rows) {
  const std::string problem = device.encode_tma_tiled(map, t.spec(base, box_rows));
  ASSERT_EQ(problem, "") << "encode_tma_tiled refused the map";
}

// The shared-memory image of one tile (column_blocks boxes of 64 x rows) at `at`, as the TMA must
// land it: element (r, c) at swizzled_offset(rows, r, c), zeros out of bounds.
inline std::vector<uint16_t> expected_tile_image(const Tensor4& t, kh::TileCoords at, int rows, int column_blocks) {
  std::vector<uint16_t> image(size_t(rows) * 64 * column_blocks);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < 64 * column_blocks; ++c)
      image[kh::swizzled_offset(rows, r, c) / 2] = t.at(at.col + c, at.row + r, at.head, at.batch);
  return image;
}

// TMA: tiles of a 4-D map over `t` (odd strides, 120 columns: the second 64-column box of every
// tile hangs past the last column) land as expected, byte for byte: one inside, one hanging past
// the last row, one at a negative row, one at a negative column.
inline void check_tma_tiles(Device& device, uint32_t seed) {
  std::mt19937 rng(seed);
  const int rows = 32, column_blocks = 2;
  const Tensor4 t(true, 120, 50, 3, 2, 16, rng);
  const kh::TileCoords tiles[kh::kTmaMaxTiles] = {
      {0, 5, 1, 1},     // inside (rows), the second box past column 120
      {0, 34, 2, 1},    // rows 34..65 of 50: the last 16 rows past the tensor's end
      {0, -13, 2, 0},   // a negative row coordinate: the first 13 rows are zeros
      {-16, 7, 0, 1}};  // a negative column coordinate: columns -16..-1 are zeros
  DeviceArray<uint16_t> dt(device, t.host, "tma tensor");
  const size_t tile_elements = size_t(rows) * 64 * column_blocks;
  DeviceArray<uint16_t> draw(device, kh::kTmaMaxTiles * tile_elements, "tma raw");
  DeviceArray<uint16_t> dun(device, kh::kTmaMaxTiles * tile_elements, "tma unswizzled");
  DeviceArray<uint32_t> dbase(device, 1, "tma smem base");
  draw.poison(), dun.poison(), dbase.poison();
  kh::TmaParams params{};
  encode(device, &params.map, t, dt.get(), rows);
  for (int i = 0; i < kh::kTmaMaxTiles; ++i) params.tiles[i] = tiles[i];
  params.tile_count = kh::kTmaMaxTiles;
  params.rows = rows;
  params.column_blocks = column_blocks;
  params.raw = reinterpret_cast<unsigned char*>(draw.get());
  params.unswizzled = dun.get();
  params.smem_base = dbase.get();
  device.launch(kh::kernels().tma, one_block(128, kh::kTmaMaxTiles * tile_elements * 2 + 8), &params);
  const std::vector<uint16_t> raw = draw.read(), unswizzled = dun.read();
  EXPECT_EQ(dbase.read()[0] % 1024, 0u) << "dynamic shared memory is not 1024-byte aligned: the swizzle is shifted";
  for (int i = 0; i < kh::kTmaMaxTiles; ++i) {
    const kh::TileCoords at = tiles[i];
    const std::vector<uint16_t> image = expected_tile_image(t, at, rows, column_blocks);
    for (size_t e = 0; e < tile_elements; ++e)
      ASSERT_EQ(raw[i * tile_elements + e], image[e])
          << "tile " << i << " (col " << at.col << ", row " << at.row << ", head " << at.head << ", batch " << at.batch
          << "): shared-memory byte offset " << 2 * e;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < 64 * column_blocks; ++c)
        ASSERT_EQ(unswizzled[i * tile_elements + size_t(r) * 64 * column_blocks + c],
                  t.at(at.col + c, at.row + r, at.head, at.batch))
            << "tile " << i << " element (" << r << ", " << c << ") read back through the swizzle";
  }
}

// out[64][n] (wgmma and mma.sync) against a double product: exact(r, c) and magnitude(r, c) given.
// Bound: check_mma's, (k + 1) f32 roundings of the magnitude; the two results agree within it too.
template <class Exact>
void expect_products(const std::vector<float>& wgmma, const std::vector<float>& mma, int n, int k, const char* what,
                     Exact&& exact_of) {
  int reported = 0;
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < n; ++c) {
      double magnitude = 0;
      const double exact = exact_of(r, c, magnitude);
      const double bound = (k + 1) * 0x1p-24 * magnitude;
      const float w = wgmma[size_t(r) * n + c], m = mma[size_t(r) * n + c];
      const bool ok = !std::isnan(w) && !std::isnan(m) && std::fabs(w - exact) <= bound &&
                      std::fabs(m - exact) <= bound && std::fabs(double(w) - m) <= bound;
      if (!ok && reported++ < 8)
        ADD_FAILURE() << what << " (" << r << ", " << c << "): wgmma " << w << ", mma.sync " << m << ", exact " << exact
                      << ", bound " << bound;
    }
  ASSERT_EQ(reported, 0) << what << ": " << reported << " elements wrong";
}

// wgmma SS: S = A B^T, A 64 x K and B N x K taken by TMA from two BSHD-like tensors (as Q and K).
inline void check_wgmma_ss(Device& device, bool bf16, int shape, uint32_t seed) {
  const int k = kh::kSsShapes[shape][0], n = kh::kSsShapes[shape][1];
  std::mt19937 rng(seed);
  const Tensor4 a(bf16, k, 90, 2, 2, 8, rng), b(bf16, k, 300, 3, 1, 8, rng);
  const kh::TileCoords a_at{0, 17, 1, 1}, b_at{0, 300 - n, 2, 0};  // B: the tensor's last n rows
  DeviceArray<uint16_t> da(device, a.host, "ss a"), db(device, b.host, "ss b");
  DeviceArray<float> dw(device, size_t(64) * n, "ss wgmma"), dm(device, size_t(64) * n, "ss mma");
  dw.poison(), dm.poison();
  kh::WgmmaSsParams params{};
  encode(device, &params.a_map, a, da.get(), 64);
  encode(device, &params.b_map, b, db.get(), n);
  params.a_at = a_at, params.b_at = b_at;
  params.wgmma_out = dw.get(), params.mma_out = dm.get();
  const kh::Kernels ks = kh::kernels();
  device.launch(bf16 ? ks.ss_bf16[shape] : ks.ss_f16[shape], one_block(128, kh::ss_smem_bytes(shape)), &params);
  const std::vector<float> w = dw.read(), m = dm.read();
  std::ostringstream what;
  what << (bf16 ? "bf16" : "f16") << " wgmma_ss K " << k << " N " << n;
  expect_products(w, m, n, k, what.str().c_str(), [&](int r, int c, double& magnitude) {
    double sum = 0;
    for (int kk = 0; kk < k; ++kk) {
      const double p = double(from_bits(bf16, a.at(kk, a_at.row + r, a_at.head, a_at.batch))) *
                       from_bits(bf16, b.at(kk, b_at.row + c, b_at.head, b_at.batch));
      sum += p, magnitude += std::fabs(p);
    }
    return sum;
  });
}

// wgmma RS, TransposeB: O = P V with P (64 x keys, values in [0, 1) as probabilities) in registers
// and V (keys x N) taken by TMA from a BSHD-like tensor, read through mn_major_desc.
inline void check_wgmma_rs(Device& device, bool bf16, int shape, uint32_t seed) {
  const int keys = kh::kRsShapes[shape][0], n = kh::kRsShapes[shape][1];
  std::mt19937 rng(seed);
  const Tensor4 v(bf16, n, 200, 2, 2, 8, rng);
  std::vector<uint16_t> p(size_t(64) * keys);
  std::uniform_real_distribution<float> prob(0.f, 1.f);
  for (auto& x : p) x = to_bits(bf16, prob(rng));
  const kh::TileCoords v_at{0, 41, 1, 1};
  DeviceArray<uint16_t> dv(device, v.host, "rs v"), dp(device, p, "rs p");
  DeviceArray<float> dw(device, size_t(64) * n, "rs wgmma"), dm(device, size_t(64) * n, "rs mma");
  dw.poison(), dm.poison();
  kh::WgmmaRsParams params{};
  encode(device, &params.v_map, v, dv.get(), keys);
  params.v_at = v_at;
  params.a = dp.get();
  params.wgmma_out = dw.get(), params.mma_out = dm.get();
  const kh::Kernels ks = kh::kernels();
  device.launch(bf16 ? ks.rs_bf16[shape] : ks.rs_f16[shape], one_block(128, kh::rs_smem_bytes(shape)), &params);
  const std::vector<float> w = dw.read(), m = dm.read();
  std::ostringstream what;
  what << (bf16 ? "bf16" : "f16") << " wgmma_rs keys " << keys << " N " << n;
  expect_products(w, m, n, keys, what.str().c_str(), [&](int r, int c, double& magnitude) {
    double sum = 0;
    for (int kk = 0; kk < keys; ++kk) {
      const double x = double(from_bits(bf16, p[size_t(r) * keys + kk])) *
                       from_bits(bf16, v.at(c, v_at.row + kk, v_at.head, v_at.batch));
      sum += x, magnitude += std::fabs(x);
    }
    return sum;
  });
}

// The mbarrier ring: `tiles` tiles of 64 rows x 128 columns through two stages (each stage's
// barriers go through tiles / 2 phases); the last tile hangs past the tensor's end (zeros).
inline void check_mbarrier_ring(Device& device, int tiles, uint32_t seed) {
  std::mt19937 rng(seed);
  const int rows = 64, column_blocks = 2, cols = 128;
  const Tensor4 t(false, cols, tiles * rows - 20, 2, 2, 8, rng);
  const int head = 1, batch = 1;
  DeviceArray<uint16_t> dt(device, t.host, "ring tensor");
  DeviceArray<uint16_t> dout(device, size_t(tiles) * rows * cols, "ring out");
  dout.poison();
  kh::RingParams params{};
  encode(device, &params.map, t, dt.get(), rows);
  params.tiles = tiles, params.rows = rows, params.column_blocks = column_blocks;
  params.head = head, params.batch = batch;
  params.out = dout.get();
  device.launch(kh::kernels().ring, one_block(kh::kRingThreads, kh::ring_smem_bytes(rows, column_blocks)), &params);
  const std::vector<uint16_t> out = dout.read();
  for (int tile = 0; tile < tiles; ++tile)
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        ASSERT_EQ(out[(size_t(tile) * rows + r) * cols + c], t.at(c, tile * rows + r, head, batch))
            << "tile " << tile << " (stage " << tile % kh::kRingStages << ", round " << tile / kh::kRingStages
            << ") element (" << r << ", " << c << ")";
}

#if SELFATTN_SIM
// Sim only: the accumulators of an issued wgmma are NaN until wgmma_wait and wgmma_fence_operands;
// after both, the product.
inline void check_wgmma_accumulators_before_wait(Device& device, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> real(-2.f, 2.f);
  std::vector<uint16_t> a(64 * 64), b(64 * 64);
  for (auto& x : a) x = to_bits(false, real(rng));
  for (auto& x : b) x = to_bits(false, real(rng));
  DeviceArray<uint16_t> da(device, a, "early a"), db(device, b, "early b");
  DeviceArray<float> dbefore(device, 64 * 64, "early before"), dunfenced(device, 64 * 64, "early unfenced"),
      dafter(device, 64 * 64, "early after");
  dbefore.poison(), dunfenced.poison(), dafter.poison();
  const kh::EarlyReadParams params{da.get(), db.get(), dbefore.get(), dunfenced.get(), dafter.get()};
  device.launch(kh::sim_only_kernels().wgmma_early_read, one_block(128, 2 * 8192), &params);
  const std::vector<float> before = dbefore.read(), unfenced = dunfenced.read(), after = dafter.read();
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 64; ++c) {
      ASSERT_TRUE(std::isnan(before[r * 64 + c])) << "D(" << r << ", " << c << ") read before wgmma_wait is "
                                                  << before[r * 64 + c] << ", not NaN";
      ASSERT_TRUE(std::isnan(unfenced[r * 64 + c])) << "D(" << r << ", " << c << ") read after wgmma_wait but before "
                                                    << "wgmma_fence_operands is " << unfenced[r * 64 + c] << ", not NaN";
      double exact = 0, magnitude = 0;
      for (int kk = 0; kk < 64; ++kk) {
        const double p = double(from_bits(false, a[r * 64 + kk])) * from_bits(false, b[c * 64 + kk]);
        exact += p, magnitude += std::fabs(p);
      }
      ASSERT_NEAR(after[r * 64 + c], exact, 65 * 0x1p-24 * magnitude) << "D(" << r << ", " << c << ") after the wait";
    }
}

// Sim only: what launching wgmma_register_touch_kernel reports ("" if it runs clean).
inline std::string wgmma_register_touch_report(Device& device, int touch) {
  const kh::RegisterTouchParams params{touch};
  try {
    device.launch(kh::sim_only_kernels().wgmma_register_touch, one_block(128, 8192), &params);
  } catch (const BackendError& e) {
    return e.what();
  }
  return "";
}

// Sim only: a read of a TMA destination before the barrier wait is reported. Returns the message.
inline std::string tma_read_before_wait_report(Device& device) {
  std::mt19937 rng(5);
  const Tensor4 t(true, 64, 8, 1, 1, 0, rng);
  DeviceArray<uint16_t> dt(device, t.host, "early tma tensor");
  DeviceArray<uint16_t> dout(device, 1, "early tma out");
  kh::TmaEarlyReadParams params{};
  encode(device, &params.map, t, dt.get(), 8);
  params.out = dout.get();
  try {
    device.launch(kh::sim_only_kernels().tma_early_read, one_block(128, 1024 + 8), &params);
  } catch (const BackendError& e) {
    return e.what();
  }
  return "";
}
#endif

}  // namespace selfattn::primitive_tests
