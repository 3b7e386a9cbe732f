#pragma once
// The Tensor Memory Accelerator's tensor map (CUtensorMap): 128 opaque bytes, made on the host and
// passed to kernels inside their __grid_constant__ params. On the GPU the driver writes them
// (cuTensorMapEncodeTiled, host/src/runtime/device_cuda.cu); on the sim, sim_encode_tma_tiled() below
// writes its own reading of them (SimTmaMap), which the TMA twin in primitives_hopper.cuh reads.
// Plain data, for nvcc and the host compiler alike. Tile mode, 16-bit elements, zero fill out of
// bounds, no interleave, no L2 promotion choices beyond the default.
#include <cstdint>
#include <cstring>
#include <string>

namespace selfattn::kernels {

struct alignas(64) TmaDescriptor {
  unsigned char bytes[128];
};

enum class TmaSwizzle : int { none = 0, b32 = 32, b64 = 64, b128 = 128 };

// What the host asks for: cuTensorMapEncodeTiled's arguments. Dimension 0 is the contiguous one.
struct TmaTiledSpec {
  const void* base = nullptr;
  int rank = 0;                  // 1..5
  int element_bytes = 2;         // 2: f16 / bf16
  uint64_t dims[5] = {};         // elements per dimension
  uint64_t strides_bytes[5] = {};  // stride of dimension i in bytes; [0] is element_bytes (implied)
  uint32_t box[5] = {};          // the box each copy moves, elements per dimension
  TmaSwizzle swizzle = TmaSwizzle::none;
};

// Why cuTensorMapEncodeTiled would refuse the spec (its documented requirements), or "".
inline std::string tma_spec_problem(const TmaTiledSpec& s) {
  if (s.rank < 1 || s.rank > 5) return "rank must be 1..5";
  if (s.element_bytes != 1 && s.element_bytes != 2 && s.element_bytes != 4 && s.element_bytes != 8)
    return "element size must be 1, 2, 4 or 8 bytes";
  if (reinterpret_cast<uintptr_t>(s.base) % 16 != 0) return "global address must be 16-byte aligned";
  for (int i = 0; i < s.rank; ++i) {
    if (s.dims[i] == 0 || s.dims[i] > (uint64_t(1) << 32)) return "dimension " + std::to_string(i) + " must be 1..2^32";
    if (s.box[i] == 0 || s.box[i] > 256) return "box dimension " + std::to_string(i) + " must be 1..256";
    if (i > 0 && (s.strides_bytes[i] % 16 != 0 || s.strides_bytes[i] >= (uint64_t(1) << 40)))
      return "stride " + std::to_string(i) + " must be a multiple of 16 bytes below 2^40";
  }
  const uint64_t inner = uint64_t(s.box[0]) * unsigned(s.element_bytes);
  if (inner % 16 != 0) return "the box's inner dimension must span a multiple of 16 bytes";
  if (s.swizzle != TmaSwizzle::none && inner > uint64_t(int(s.swizzle)))
    return "the box's inner dimension must not span more than the swizzle (" + std::to_string(int(s.swizzle)) + " bytes)";
  return "";
}

// The sim's layout of the 128 bytes (never seen by the GPU).
struct SimTmaMap {
  static constexpr uint32_t kMagic = 0x544D4150u;  // "TMAP": the twin refuses anything else
  uint32_t magic;
  int32_t rank;
  int32_t element_bytes;
  int32_t swizzle_bytes;  // 0, 32, 64, 128
  const void* base;
  uint64_t dims[5];
  uint64_t strides_bytes[5];
  uint32_t box[5];
};
static_assert(sizeof(SimTmaMap) <= sizeof(TmaDescriptor), "the sim's map fits the 128 bytes");

// The sim backend's cuTensorMapEncodeTiled. Returns tma_spec_problem(spec); writes `out` only if "".
inline std::string sim_encode_tma_tiled(TmaDescriptor* out, const TmaTiledSpec& spec) {
  std::string problem = tma_spec_problem(spec);
  if (!problem.empty()) return problem;
  SimTmaMap map{};
  map.magic = SimTmaMap::kMagic;
  map.rank = spec.rank;
  map.element_bytes = spec.element_bytes;
  map.swizzle_bytes = int(spec.swizzle);
  map.base = spec.base;
  for (int i = 0; i < 5; ++i) {
    map.dims[i] = i < spec.rank ? spec.dims[i] : 1;
    map.strides_bytes[i] = i == 0 ? uint64_t(spec.element_bytes) : spec.strides_bytes[i];
    map.box[i] = i < spec.rank ? spec.box[i] : 1;
  }
  std::memset(out->bytes, 0, sizeof out->bytes);
  std::memcpy(out->bytes, &map, sizeof map);
  return "";
}

}  // namespace selfattn::kernels
