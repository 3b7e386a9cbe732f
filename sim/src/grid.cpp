// The grid: a launch's blocks spread over a pool of worker OS threads (the caller is one of them).
// Blocks are handed out one at a time from a shared counter; each runs to its end on one worker.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "block_runner.h"
#include "compiled_kernels.h"
#include "profile_internal.h"
#include "racecheck.h"
#include "watchdog.h"
#include "selfattn_sim/sim.h"

namespace selfattn::sim {

namespace {

constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr size_t kMaxDynamicSmem = 227 * 1024;  // H200's opt-in per-block limit

struct Job {
  const LaunchConfig* config = nullptr;
  void (*body)(const void*) = nullptr;
  const void* params = nullptr;
  uint64_t blocks = 0;
  uint64_t seed = 0;
  // Blocks start in a seed-dependent order: the i-th block taken is (offset + i * stride) mod blocks,
  // stride coprime to blocks (a bijection). The hardware promises no order between blocks, so a
  // kernel whose result depends on one (fp32 atomics summed in a fixed order, a block reading what
  // another wrote) differs between seeds instead of passing by luck.
  uint64_t stride = 1, offset = 0;
  const detail::race::LaunchState* race = nullptr;
  detail::profile::LaunchProfiler* profiler = nullptr;
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  uint64_t error_block = ~uint64_t(0);
  std::exception_ptr error;

  void work() {
    while (!failed.load(std::memory_order_relaxed)) {
      const uint64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= blocks) return;
      const uint64_t block = uint64_t((offset + static_cast<unsigned __int128>(i) * stride) % blocks);
      try {
        detail::run_block(*config, body, params, block, seed, race, profiler);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (block < error_block) {  // report the lowest failing block: stable across worker counts
          error_block = block;
          error = std::current_exception();
        }
        failed = true;
      }
    }
  }
};

class Pool {
 public:
  // Runs the job on the calling thread and `helpers` pool threads; returns when all are done.
  void run(Job& job, unsigned helpers) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (threads_.size() < helpers) {
        const unsigned index = unsigned(threads_.size());
        threads_.emplace_back([this, index, seen = generation_] { thread_main(index, seen); });
      }
      job_ = &job;
      wanted_ = helpers;
      busy_ = helpers;
      ++generation_;
    }
    work_ready_.notify_all();
    job.work();
    std::unique_lock<std::mutex> lock(mutex_);
    all_done_.wait(lock, [this] { return busy_ == 0; });
    job_ = nullptr;
  }

 private:
  void thread_main(unsigned index, uint64_t seen) {
    for (;;) {
      Job* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_ready_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (index >= wanted_) continue;
        job = job_;
      }
      job->work();
      std::lock_guard<std::mutex> lock(mutex_);
      if (--busy_ == 0) all_done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_ready_, all_done_;
  std::vector<std::thread> threads_;
  Job* job_ = nullptr;
  uint64_t generation_ = 0;
  unsigned wanted_ = 0;
  unsigned busy_ = 0;
};

void validate(const LaunchConfig& c) {
  const std::string name = std::string("sim: launch of kernel '") + c.kernel_name + "': ";
  const uint64_t threads = uint64_t(c.block.x) * c.block.y * c.block.z;
  if (c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 || threads == 0) throw Error(name + "empty grid or block");
  if (threads > kMaxThreadsPerBlock || c.block.x > 1024 || c.block.y > 1024 || c.block.z > 64)
    throw Error(name + "block (" + std::to_string(c.block.x) + "," + std::to_string(c.block.y) + "," +
                std::to_string(c.block.z) + ") exceeds the limits (1024 threads; 1024 x 1024 x 64)");
  if (c.grid.x > 0x7fffffffu || c.grid.y > 65535 || c.grid.z > 65535)
    throw Error(name + "grid exceeds the limits (2^31-1 x 65535 x 65535)");
  if (c.dynamic_smem_bytes > kMaxDynamicSmem)
    throw Error(name + std::to_string(c.dynamic_smem_bytes) + " bytes of dynamic shared memory exceed the " +
                std::to_string(kMaxDynamicSmem) + " an H200 block may have");
  detail::check_compiled_resources(c);
}

// The process's pool, created on first use and never destroyed: its threads sleep until exit.
// A fork()ed child (e.g. a gtest death test) has none of its parent's threads, so it gets its own.
Pool& the_pool() {
  static Pool* pool = nullptr;
  static pid_t owner = 0;
  if (!pool || owner != getpid()) {
    pool = new Pool;
    owner = getpid();
  }
  return *pool;
}

}  // namespace

void launch(const LaunchConfig& config, void (*body)(const void* params), const void* params) {
  if (detail::inside_kernel()) throw Error("sim: launch() called from inside a kernel");
  validate(config);
  detail::start_watchdog();
  static std::mutex launch_mutex;  // one grid at a time: the pool and the workers' fibers are shared
  std::lock_guard<std::mutex> lock(launch_mutex);

  const Options opts = options();
  Job job;
  job.config = &config;
  job.body = body;
  job.params = params;
  job.blocks = uint64_t(config.grid.x) * config.grid.y * config.grid.z;
  job.seed = opts.seed;
  {
    uint64_t z = opts.seed * 0x9E3779B97F4A7C15ull + job.blocks;
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
    job.offset = z % job.blocks;
    job.stride = 1 + (z >> 17) % job.blocks;
    while (std::gcd(job.stride, job.blocks) != 1) ++job.stride;
  }
  // The racecheck's instrumentation hooks serve the racecheck and the profiler: on for either.
  detail::race::LaunchState race;
  race.racecheck = opts.racecheck;
  if (opts.racecheck || opts.profile) {
    detail::race::begin_launch(race, config, job.blocks);
    job.race = &race;
  }
  std::unique_ptr<detail::profile::LaunchProfiler> profiler;
  std::optional<detail::profile::ProfilingLaunch> profiling;  // the twins' profiling() while it runs
  if (opts.profile) {
    profiler = std::make_unique<detail::profile::LaunchProfiler>(config, race, job.blocks);
    job.profiler = profiler.get();
    profiling.emplace();
  }
  uint64_t workers = opts.worker_threads > 0 ? unsigned(opts.worker_threads)
                                             : std::max(1u, std::thread::hardware_concurrency());
  workers = std::min<uint64_t>(workers, job.blocks);
  the_pool().run(job, unsigned(workers - 1));
  const std::string after = "launch of kernel '" + std::string(config.kernel_name) + "'";
  if (job.error) {
    // The launch's own error (an out-of-bounds write reported at the access, say) explains any
    // damage to the guard zones: restore them quietly, so the next launch is not blamed for it.
    try {
      check_guards(after.c_str());
    } catch (const Error&) {
    }
    std::rethrow_exception(job.error);
  }
  check_guards(after.c_str());
  if (profiler) detail::profile::record(profiler->finish());
}

}  // namespace selfattn::sim
