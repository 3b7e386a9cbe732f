#pragma once
// The arithmetic behind the sim twins of primitives.cuh, written as plain functions over a whole
// warp: "given what the 32 lanes bring, compute what each lane gets back". The twins hand these to
// sim::warp_collective, whose combine receives exactly such per-lane pointer arrays; the unit tests
// (tests/primitives/test_warp_math.cpp) call them directly, without fibers.
// The combines are SELFATTN_SIM_UNCHECKED: they run in one lane's fiber for all 32, so the
// racecheck must not charge their accesses to that lane (the ldmatrix twin reports each lane's row).
// Host compiler only: nvcc never sees this file.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "compat.h"
#include "primitives_fragments.cuh"

#if !SELFATTN_SIM
#error "primitives_sim.cuh is the sim's half of primitives.cuh; nvcc builds use the inline PTX"
#endif

SELFATTN_KERNELS_BEGIN
namespace sim_warp {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xffffffffu;

// ---- 16-bit operands ------------------------------------------------------------------------
// e4m3: 8-bit, only for the Hopper FP8 wgmma (primitives_hopper*.cuh); mma.sync's twins take f16/bf16.
enum class Operand { f16, bf16, e4m3 };

inline uint16_t register_half(uint32_t reg, int i) { return uint16_t(i ? reg >> 16 : reg & 0xffffu); }

// Both conversions are exact: every f16 and bf16 value is an f32 value.
inline float f16_bits_to_float(uint16_t bits) {
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}
inline float bf16_bits_to_float(uint16_t bits) {
  const uint32_t widened = uint32_t(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof value);
  return value;
}
template <Operand T>
float operand_to_float(uint16_t bits) {
  return T == Operand::f16 ? f16_bits_to_float(bits) : bf16_bits_to_float(bits);
}

// ---- mma.sync.aligned.m16n8k{8,16}.row.col.f32.{f16,bf16}.{f16,bf16}.f32 ---------------------
template <int K>
struct MmaLaneIn {
  static_assert(K == 8 || K == 16, "m16n8k8 and m16n8k16 only");
  uint32_t a[K / 4];  // K/2 elements of A, two per register
  uint32_t b[K / 8];  // K/4 elements of B
  float c[4];
};
struct MmaLaneOut {
  float d[4];
};

// D = A B + C. Rounding choice (the ISA leaves the accumulation order unspecified, and hardware
// differs between generations): every product of two converted inputs is exact in f32 (f16: 22
// significant bits, bf16: 16), and the products are added to C one at a time in k order, each sum
// rounded to nearest-even in f32 (fmaf, so a bf16 product beyond f32's range is not rounded twice).
// A GPU's result may differ from this by a few f32 ulps of sum|a*b|; tests compare with a tolerance.
template <Operand T, int K>
SELFATTN_SIM_UNCHECKED void mma_m16n8(const MmaLaneIn<K>* const* lanes, MmaLaneOut* const* outs) {
  float a[16][K], b[K][8], c[16][8];
  for (int lane = 0; lane < kWarpSize; ++lane) {
    const MmaLaneIn<K>& in = *lanes[lane];
    for (int i = 0; i < K / 2; ++i) {
      const FragmentCoord at = K == 16 ? mma_m16n8k16_a(lane, i) : mma_m16n8k8_a(lane, i);
      a[at.row][at.col] = operand_to_float<T>(register_half(in.a[i / 2], i & 1));
    }
    for (int i = 0; i < K / 4; ++i) {
      const FragmentCoord at = K == 16 ? mma_m16n8k16_b(lane, i) : mma_m16n8k8_b(lane, i);
      b[at.row][at.col] = operand_to_float<T>(register_half(in.b[i / 2], i & 1));
    }
    for (int i = 0; i < 4; ++i) {
      const FragmentCoord at = mma_m16n8k16_c(lane, i);
      c[at.row][at.col] = in.c[i];
    }
  }
  for (int lane = 0; lane < kWarpSize; ++lane) {
    for (int i = 0; i < 4; ++i) {
      const FragmentCoord at = mma_m16n8k16_c(lane, i);
      float sum = c[at.row][at.col];
      for (int k = 0; k < K; ++k) sum = std::fmaf(a[at.row][k], b[k][at.col], sum);
      outs[lane]->d[i] = sum;
    }
  }
}

// ---- ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16 ---------------------------------
struct RowAddress {
  const void* row;  // 8 consecutive 16-bit elements, 16-byte aligned
};
template <int Count>
struct LdmatrixRegs {
  uint32_t r[Count];
};

// Lanes 8*Count and above supply no address (the ISA ignores theirs), so only the used rows are read.
template <int Count, bool Transposed>
SELFATTN_SIM_UNCHECKED void ldmatrix(const RowAddress* const* lanes, LdmatrixRegs<Count>* const* outs) {
  static_assert(Count == 1 || Count == 2 || Count == 4, "ldmatrix loads 1, 2 or 4 matrices");
  for (int lane = 0; lane < kWarpSize; ++lane) {
    for (int m = 0; m < Count; ++m) {
      uint32_t reg = 0;
      for (int i = 0; i < 2; ++i) {
        const FragmentCoord at = ldmatrix_element(lane, i, Transposed);
        uint16_t element;
        std::memcpy(&element, static_cast<const unsigned char*>(lanes[8 * m + at.row]->row) + 2 * at.col, 2);
        reg |= uint32_t(element) << (16 * i);
      }
      outs[lane]->r[m] = reg;
    }
  }
}

// ---- shuffles and butterfly reductions ------------------------------------------------------
// out[lane] = in[lane ^ lane_mask], what __shfl_xor_sync(0xffffffff, v, lane_mask) gives each lane.
template <class T>
SELFATTN_SIM_UNCHECKED void shuffle_xor(const T* const* lanes, T* const* outs, int lane_mask) {
  for (int lane = 0; lane < kWarpSize; ++lane) *outs[lane] = *lanes[lane ^ lane_mask];
}

// The GPU's xor butterfly step by step (offsets Width/2 .. 1, each lane combining its own value with
// its partner's, own value first), so the sim reproduces its rounding bit for bit.
template <int Width, class Op>
SELFATTN_SIM_UNCHECKED void butterfly_reduce(const float* const* lanes, float* const* outs, Op op) {
  static_assert(Width == 2 || Width == 4 || Width == 8 || Width == 16 || Width == 32, "power-of-two width");
  float value[kWarpSize];
  for (int lane = 0; lane < kWarpSize; ++lane) value[lane] = *lanes[lane];
  for (int offset = Width / 2; offset > 0; offset /= 2) {
    float next[kWarpSize];
    for (int lane = 0; lane < kWarpSize; ++lane) next[lane] = op(value[lane], value[lane ^ offset]);
    std::memcpy(value, next, sizeof value);
  }
  for (int lane = 0; lane < kWarpSize; ++lane) *outs[lane] = value[lane];
}
inline float max_op(float a, float b) { return std::fmax(a, b); }  // fmaxf: a NaN loses to a number
inline float sum_op(float a, float b) { return a + b; }

// ---- vector loads and stores ----------------------------------------------------------------------
// noinline: its return address is the kernel's load or store, which a report names. Returns whether
// the profiler counted the access: the caller then ends it (sim::profile_vector_done) after the
// copy, whose 4-byte pieces are not counted again.
__attribute__((noinline)) inline bool check_vector_access(const void* address, size_t bytes, bool write) {
  static_assert(sizeof(uint4) == 16, "vector types as CUDA has them");
  sim::check_access(address, bytes, write, /*natural=*/true, __builtin_return_address(0));
  if (!sim::profiling()) return false;
  sim::profile_vector_access(address, bytes, write, __builtin_return_address(0));
  return true;
}

// ---- cp.async ---------------------------------------------------------------------------------
// Why a copy may not be issued, or "" when it may. `smem`/`smem_bytes` is the block's dynamic
// shared memory, the only shared memory the library's kernels use.
inline std::string cp_async_problem(const void* dst, const void* src, unsigned cp_size, unsigned src_size,
                                    const void* smem, size_t smem_bytes) {
  const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  const auto base = reinterpret_cast<uintptr_t>(smem);
  if (cp_size != 4 && cp_size != 8 && cp_size != 16) return "cp-size must be 4, 8 or 16 bytes";
  if (src_size > cp_size) return "src-size " + std::to_string(src_size) + " exceeds cp-size " + std::to_string(cp_size);
  if (d % cp_size != 0) return "destination is not aligned to the " + std::to_string(cp_size) + "-byte copy size";
  // Strict even when src_size is 0 (nothing read): the ISA asks both addresses to be aligned.
  if (s % cp_size != 0) return "source is not aligned to the " + std::to_string(cp_size) + "-byte copy size";
  if (d < base || d + cp_size > base + smem_bytes) return "destination is not inside the block's dynamic shared memory";
  return "";
}

// The copy lands; for the racecheck, its write (in flight since the issue) happens now.
SELFATTN_SIM_UNCHECKED inline void perform(const sim::AsyncCopy& copy) {
  if (copy.bytes) std::memcpy(copy.dst, copy.src, copy.bytes);
  if (copy.zero_fill) std::memset(static_cast<unsigned char*>(copy.dst) + copy.bytes, 0, copy.zero_fill);
  sim::racecheck_async_landed(copy.dst, copy.bytes + copy.zero_fill);
}

// cp.async.wait_group N: every committed group but the newest `pending` is complete afterwards.
SELFATTN_SIM_UNCHECKED inline void complete_all_but_newest(std::vector<std::vector<sim::AsyncCopy>>& groups,
                                                           size_t pending) {
  if (groups.size() <= pending) return;
  const size_t done = groups.size() - pending;
  for (size_t g = 0; g < done; ++g)
    for (const sim::AsyncCopy& copy : groups[g]) perform(copy);
  groups.erase(groups.begin(), groups.begin() + std::ptrdiff_t(done));
}

// ---- reporting ----------------------------------------------------------------------------------
// "what: why (block (x,y,z) thread (x,y,z))", thrown as sim::Error from inside a launch.
[[noreturn]] inline void fail(const char* what, const std::string& why) {
  const sim::ThreadContext& t = sim::current_thread();
  throw sim::Error(std::string(what) + ": " + why + " (block (" + std::to_string(t.block_idx.x) + "," +
                   std::to_string(t.block_idx.y) + "," + std::to_string(t.block_idx.z) + ") thread (" +
                   std::to_string(t.thread_idx.x) + "," + std::to_string(t.thread_idx.y) + "," +
                   std::to_string(t.thread_idx.z) + "))");
}

// The warp-wide primitives (.sync.aligned instructions, full-mask shuffles) need all 32 lanes: a
// partial last warp, or lanes that already returned, leave the GPU undefined (often hung); the sim
// says so instead of running the instruction on missing inputs.
inline void require_full_warp(const char* what) {
  const unsigned live = sim::warp_live_mask();
  if (live != kFullWarp) {
    char mask[16];
    std::snprintf(mask, sizeof mask, "0x%08x", live);
    fail(what, std::string("needs all 32 lanes of the warp, but only lanes ") + mask +
                   " exist and have not exited (block size not a multiple of 32, or an early return)");
  }
}

// Why an ldmatrix row address is unusable, or "".
inline std::string ldmatrix_row_problem(const void* row, const void* smem, size_t smem_bytes) {
  const auto r = reinterpret_cast<uintptr_t>(row), base = reinterpret_cast<uintptr_t>(smem);
  if (r % 16 != 0) return "row address is not 16-byte aligned";
  if (r < base || r + 16 > base + smem_bytes) return "row is not inside the block's dynamic shared memory";
  return "";
}

}  // namespace sim_warp
SELFATTN_KERNELS_END
