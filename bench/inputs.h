#pragma once
// The input sets inputs.cpp makes and measure.cpp times (InputCache's contents).
#include <vector>

#include "bench.h"

namespace selfattn_bench {

// The inputs of the last shape measured: the host values (for the check) and the device copies.
// The backward's buffers (dout and the gradients, the forward's LSE) are added to every set the
// first time a backward case of the shape runs.
struct InputCache::Inputs {
  Case shape;
  std::vector<float> q, k, v;  // BHSD, rounded to the dtype (FP8: each code's value x its descale)
  selfattn::DeviceBuffer<float> descales;  // FP8 inputs: q's, k's, v's [batch, kv_heads], one after another
  std::vector<float> dout;     // BHSD, rounded; empty until a backward case needs it
  struct Set {
    selfattn::DeviceBuffer<unsigned char> q, k, v, out;
    selfattn::DeviceBuffer<unsigned char> dout, dq, dk, dv;
    selfattn::DeviceBuffer<float> lse;
  };
  std::vector<Set> sets;
};

// The backward's buffers (dout and the gradients, the forward's LSE), added to every set of `in`
// the first time a backward case of its shape runs.
void add_backward_buffers(selfattn::Context& ctx, InputCache::Inputs& in);

}  // namespace selfattn_bench
