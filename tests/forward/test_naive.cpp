// What only the naive path has: its kernel choice. Its correctness sweeps, shared with the cublas
// path, are in test_score_paths.cpp.
#include <gtest/gtest.h>

#include <string>

#include "kernels/registry.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

// The sweeps in test_score_paths only test the tensor-core kernels if the registry picks them: f16/bf16 from
// head_dim 16 on; the SIMT kernels for f32 and small head dims.
TEST(NaivePath, RegistryPicksTensorCoresForHalfTypes) {
  using kernels::Element;
  namespace sim = kernels::sim_target;
  EXPECT_NE(std::string(sim::qk_tiled_instance(Element::f16, 64).kernel.name).find("mma"), std::string::npos);
  EXPECT_NE(std::string(sim::pv_tiled_instance(Element::bf16, 80).kernel.name).find("mma"), std::string::npos);
  EXPECT_NE(std::string(sim::qk_tiled_instance(Element::bf16, 7).kernel.name).find("simt"), std::string::npos);
  EXPECT_NE(std::string(sim::pv_tiled_instance(Element::f32, 128).kernel.name).find("simt"), std::string::npos);
}

}  // namespace
}  // namespace selfattn
