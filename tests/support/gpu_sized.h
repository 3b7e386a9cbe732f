#pragma once
// A fixture for cases at sizes the sim would take minutes over: thousands of keys, every head dim at
// many tiles. Name the suite "<Subject>OnGpu" (using FusedPathOnGpu = testing::GpuSized<>;): the
// sim's registrations leave such suites out (tests/CMakeLists.txt), the program's `.gpu`
// registration runs them, and run directly on the sim they skip, saying so.
#include <gtest/gtest.h>

#include "selfattn/selfattn.h"

namespace selfattn::testing {

template <class Base = ::testing::Test>
class GpuSized : public Base {
 protected:
  void SetUp() override {
    if (ctx.backend() == Backend::sim) GTEST_SKIP() << "a GPU-sized case (SELFATTN_BACKEND=cuda runs it)";
  }

  Context ctx;  // the backend SELFATTN_BACKEND names
};

}  // namespace selfattn::testing
