// Measures the sim's cost per fiber switch, raw and inside launches (not a test: prints numbers).
//   sim_switch_bench                              the x86-64 switch (default)
//   SELFATTN_SIM_FIBERS=ucontext sim_switch_bench  swapcontext
#include <time.h>

#include <cstdio>

#include "../../sim/src/fiber.h"
#include "common/compat.h"
#include "sim_test_launch.h"

namespace sim = selfattn::sim;
namespace detail = selfattn::sim::detail;

namespace {

// CPU time of this thread, not wall time: the numbers stay meaningful on a loaded machine.
// Launches below use one worker, the calling thread.
double thread_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

double seconds_since(double start) { return thread_seconds() - start; }

detail::FiberContext main_context, fiber_context;

void ping_pong(void*) {
  for (;;) detail::fiber_switch(fiber_context, main_context);
}

struct LoopParams {
  int iterations;
  float* sink;
};

__global__ void barrier_loop(const LoopParams p) {
  float v = float(threadIdx.x);
  for (int i = 0; i < p.iterations; ++i) {
    v = v * 0.5f + 1.0f;
    __syncthreads();
  }
  p.sink[threadIdx.x] = v;
}

__global__ void shuffle_loop(const LoopParams p) {
  float v = float(threadIdx.x);
  for (int i = 0; i < p.iterations; ++i) v += __shfl_xor_sync(0xffffffffu, v, 1) * 0.5f;
  p.sink[threadIdx.x] = v;
}

}  // namespace

int main() {
  std::printf("switch: %s\n", detail::switch_kind() == detail::SwitchKind::assembly ? "x86-64 assembly" : "ucontext");

  detail::FiberStack stack(detail::fiber_stack_bytes());
  detail::fiber_prepare(fiber_context, stack, &ping_pong, nullptr);
  const int round_trips = 1000000;
  double start = thread_seconds();
  for (int i = 0; i < round_trips; ++i) detail::fiber_switch(main_context, fiber_context);
  std::printf("raw switch: %.1f ns\n", seconds_since(start) / (2.0 * round_trips) * 1e9);

  sim::testing::ScopedOptions one_worker(sim::testing::with_workers(1));
  static float sink[1024];
  for (unsigned threads : {128u, 1024u}) {
    const int iterations = 2000;
    start = thread_seconds();
    sim::testing::launch<LoopParams, barrier_loop>("barrier_loop", dim3(1), dim3(threads), {iterations, sink});
    const double t = seconds_since(start);
    std::printf("__syncthreads, %4u threads: %.1f ns per thread per barrier (%.2f us per block barrier)\n", threads,
                t / (double(threads) * iterations) * 1e9, t / iterations * 1e6);
    start = thread_seconds();
    sim::testing::launch<LoopParams, shuffle_loop>("shuffle_loop", dim3(1), dim3(threads), {iterations, sink});
    const double s = seconds_since(start);
    std::printf("__shfl_xor_sync, %4u threads: %.1f ns per thread per shuffle\n", threads,
                s / (double(threads) * iterations) * 1e9);
  }
  return 0;
}
