#pragma once
// What the Hopper layout programs (test_hopper_layouts*.cpp) share: CuTe with a host
// __cvta_generic_to_shared, a 1024-aligned stand-in for shared memory both CuTe's descriptors and
// ours measure from, and the descriptor fields compared with CuTe's bitfield. Include it before any
// CuTe header. One test source a program: its helpers sit in an anonymous namespace.
#include <cstddef>
#include <cstdint>

// make_gmma_desc takes the start address from cast_smem_ptr_to_uint, which on the host has no
// shared window to convert to (it prints an error and returns 0). Giving CuTe a host
// __cvta_generic_to_shared that measures from the test's 1024-aligned buffer makes its descriptors
// carry real start addresses, so they compare with ours bit for bit.
namespace {
const unsigned char* g_smem_base = nullptr;
}
#define CUTE_CVTA_GENERIC_TO_SHARED_ACTIVATED 1
inline size_t __cvta_generic_to_shared(const void* p) {
  return size_t(static_cast<const unsigned char*>(p) - g_smem_base);
}

#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/atom/copy_traits_sm90_tma_swizzle.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/primitives_hopper_sim.cuh"
#include "common/tma_descriptor.h"
#include "hopper/smem_layout.h"

namespace {
namespace k = selfattn::kernels;
namespace hs = selfattn::kernels::sim_target::sim_hopper;
namespace warp = selfattn::kernels::sim_target::sim_warp;
namespace GMMA = cute::SM90::GMMA;
using cute::_1;
using cute::_16;
using cute::_2;
using cute::_64;
using cute::Int;
using cute::Shape;

// A 1024-aligned stand-in for a block's dynamic shared memory, which CuTe's descriptors (through
// the hook above) and ours measure from.
struct Smem {
  static constexpr uint32_t kBytes = 256 * 1024;
  alignas(1024) unsigned char bytes[kBytes];
};
inline Smem& smem() {
  static std::unique_ptr<Smem> s = [] {
    auto p = std::make_unique<Smem>();
    g_smem_base = p->bytes;
    return p;
  }();
  return *s;
}
template <class T>
T* smem_at(uint32_t offset) {
  return reinterpret_cast<T*>(smem().bytes + offset);
}
template <class P>
uint32_t offset_of(const P* p) {
  return uint32_t(reinterpret_cast<const unsigned char*>(p) - smem().bytes);
}
inline uint16_t load16(uint32_t offset) {
  uint16_t v;
  std::memcpy(&v, smem().bytes + offset, 2);
  return v;
}
template <class Ref>
void store16(Ref&& element, uint16_t v) {
  std::memcpy(&element, &v, 2);
}

// The descriptor fields as CuTe's own bitfield holds them, against our decoding.
inline void expect_fields_match(uint64_t desc) {
  cute::GmmaDescriptor d(desc);
  const hs::GmmaDescFields f = hs::gmma_desc_fields(desc);
  EXPECT_EQ(f.start_bytes, uint32_t(d.bitfield.start_address_) << 4);
  EXPECT_EQ(f.leading_bytes, uint32_t(d.bitfield.leading_byte_offset_) << 4);
  EXPECT_EQ(f.stride_bytes, uint32_t(d.bitfield.stride_byte_offset_) << 4);
  EXPECT_EQ(f.base_offset, uint32_t(d.bitfield.base_offset_));
  const auto type = GMMA::LayoutType(d.bitfield.layout_type_);
  const int expected_swizzle = type == GMMA::LayoutType::B128  ? 128
                               : type == GMMA::LayoutType::B64 ? 64
                               : type == GMMA::LayoutType::B32 ? 32
                                                               : 0;
  EXPECT_EQ(f.swizzle_bytes, expected_swizzle);
}

}  // namespace
