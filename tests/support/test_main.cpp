// main() of every test program that links the library. A program registered for the GPU (label
// gpu, SELFATTN_BACKEND=cuda: tests/CMakeLists.txt) is often the very program the sim runs; where
// no GPU is usable, it skips all its tests here, once, with the reason, instead of each test asking.
// The "[  SKIPPED ]" line is what CTest's gtest_discover_tests takes as a skip.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "selfattn/selfattn.h"

namespace {

// Why the cuda backend that SELFATTN_BACKEND asks for cannot run here; "" when it can, or when the
// sim (or nothing) is asked for.
std::string requested_gpu_unusable() {
  const char* backend = std::getenv("SELFATTN_BACKEND");
  if (backend == nullptr || std::strcmp(backend, "cuda") != 0) return "";
  try {
    selfattn::Context probe(selfattn::Backend::cuda);
    return "";
  } catch (const selfattn::NotAvailable& e) {
    return e.what();
  }
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Listing the tests (CTest's discovery at build time) needs no GPU.
  if (!::testing::GTEST_FLAG(list_tests)) {
    if (const std::string why = requested_gpu_unusable(); !why.empty()) {
      std::printf("[  SKIPPED ] every test of %s: SELFATTN_BACKEND=cuda, and %s\n", argv[0], why.c_str());
      return 0;
    }
  }
  return RUN_ALL_TESTS();
}
