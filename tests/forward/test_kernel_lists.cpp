// The fused families' kernel lists (kernels/forward/flash_fwd_kernels.inc,
// kernels/hopper/flash_fwd_hopper_kernels.inc, kernels/backward/flash_bwd_kernels.inc), from which
// registry.inc declares the instances and the host builds its tables: every line names an instance
// the sim build defines, with a launchable shape, under a known architecture tag, and no line is
// there twice. (A line without an nvcc instance fails the CUDA build's link.)
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/registry.h"

namespace selfattn {
namespace {

using kernels::Element;
namespace sim = kernels::sim_target;

struct Line {
  std::string family, arch;
  Element element;
  int head_dim_qk, head_dim_v;
  kernels::KernelRef kernel;
  int threads;
  size_t smem_bytes;
};

std::vector<Line> listed() {
  std::vector<Line> lines;
#define SELFATTN_FLASH_FWD(arch, E, DQK, DV)                                                           \
  {                                                                                              \
    const auto instance = sim::flash_fwd_instance<Element::E, DQK, DV>();                          \
    lines.push_back({"flash_fwd", #arch, Element::E, DQK, DV, instance.kernel, instance.block_threads, \
                     instance.smem_bytes});                                                      \
  }
#define SELFATTN_FLASH_FWD_HOPPER(arch, E, DQK, DV)                                                           \
  {                                                                                                     \
    const auto instance = sim::flash_fwd_hopper_instance<Element::E, DQK, DV>();                          \
    lines.push_back({"flash_fwd_hopper", #arch, Element::E, DQK, DV, instance.kernel, instance.block_threads, \
                     instance.smem_bytes});                                                             \
  }
#define SELFATTN_FLASH_FWD_HOPPER_FP8(arch, E, DQK, DV)                                                           \
  {                                                                                                         \
    const auto instance = sim::flash_fwd_hopper_fp8_instance<Element::E, DQK>();                              \
    lines.push_back({"flash_fwd_hopper_fp8", #arch, Element::E, DQK, DV, instance.kernel, instance.block_threads, \
                     instance.smem_bytes});                                                                 \
  }
#define SELFATTN_FLASH_BWD(arch, E, DQK, DV)                                                                     \
  {                                                                                                        \
    const auto dkdv = sim::flash_bwd_dkdv_instance<Element::E, DQK, DV>();                                   \
    const auto dq = sim::flash_bwd_dq_instance<Element::E, DQK, DV>();                                       \
    lines.push_back({"flash_bwd_dkdv", #arch, Element::E, DQK, DV, dkdv.kernel, dkdv.block_threads, dkdv.smem_bytes}); \
    lines.push_back({"flash_bwd_dq", #arch, Element::E, DQK, DV, dq.kernel, dq.block_threads, dq.smem_bytes});    \
  }
#include "kernels/backward/flash_bwd_kernels.inc"
#include "kernels/forward/flash_fwd_kernels.inc"
#include "kernels/hopper/flash_fwd_hopper_kernels.inc"
#undef SELFATTN_FLASH_FWD
#undef SELFATTN_FLASH_FWD_HOPPER
#undef SELFATTN_FLASH_FWD_HOPPER_FP8
#undef SELFATTN_FLASH_BWD
  return lines;
}

std::string describe(const Line& line) {
  return line.family + "(" + line.arch + ", element " + std::to_string(int(line.element)) + ", head dims " +
         std::to_string(line.head_dim_qk) + ", " + std::to_string(line.head_dim_v) + ")";
}

TEST(KernelLists, EveryLineHasALaunchableSimInstance) {
  const std::vector<Line> lines = listed();
  ASSERT_GE(lines.size(), 44u);  // 12 mma.sync, 8 Hopper, 4 Hopper FP8, 10 x 2 backward today
  for (const Line& line : lines) {
    EXPECT_TRUE(bool(line.kernel)) << describe(line);
    EXPECT_NE(line.kernel.name, nullptr) << describe(line);
    EXPECT_GT(line.threads, 0) << describe(line);
    EXPECT_LE(line.threads, 1024) << describe(line);
    EXPECT_LE(line.smem_bytes, size_t(227) * 1024) << describe(line);  // an H100's opt-in limit per block
    EXPECT_GT(line.head_dim_qk, 0) << describe(line);
    EXPECT_LE(line.head_dim_qk, 256) << describe(line);
    EXPECT_GT(line.head_dim_v, 0) << describe(line);
    EXPECT_LE(line.head_dim_v, line.head_dim_qk) << describe(line);
    // Keyed by both head dims; only the FP8 Hopper kernel's traits take one (registry.inc asserts
    // that its lines give equal ones).
    if (line.family == "flash_fwd_hopper_fp8") {
      EXPECT_EQ(line.head_dim_v, line.head_dim_qk) << describe(line);
    }
  }
}

TEST(KernelLists, NoLineTwice) {
  std::set<std::tuple<std::string, int, int, int>> seen;
  for (const Line& line : listed())
    EXPECT_TRUE(seen.insert({line.family, int(line.element), line.head_dim_qk, line.head_dim_v}).second)
        << describe(line);
}

TEST(KernelLists, EachFamilyUnderItsArchitectureTag) {
  // The tags of runtime/capability.h: sm80, the portable code; sm90a, Hopper's alone (wgmma, TMA),
  // whose instance files live in kernels/instances/sm90a/.
  for (const Line& line : listed()) {
    const bool hopper = line.family.rfind("flash_fwd_hopper", 0) == 0;
    EXPECT_EQ(line.arch, hopper ? "sm90a" : "sm80") << describe(line);
  }
}

}  // namespace
}  // namespace selfattn
