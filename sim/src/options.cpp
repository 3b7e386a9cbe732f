// The sim's options: set from the environment once, then by set_options().
#include <cstdlib>
#include <mutex>

#include "selfattn_sim/sim.h"

namespace selfattn::sim {

namespace {

std::mutex& options_mutex() {
  static std::mutex m;
  return m;
}

Options& current_options() {
  static Options options = [] {
    Options o;
    if (const char* seed = std::getenv("SELFATTN_SIM_SEED")) o.seed = std::strtoull(seed, nullptr, 0);
    if (const char* threads = std::getenv("SELFATTN_SIM_THREADS")) o.worker_threads = std::atoi(threads);
    if (const char* racecheck = std::getenv("SELFATTN_SIM_RACECHECK")) o.racecheck = std::atoi(racecheck) != 0;
    if (const char* profile = std::getenv("SELFATTN_SIM_PROFILE")) o.profile = std::atoi(profile) != 0;
    return o;
  }();
  return options;
}

}  // namespace

Options options() {
  std::lock_guard<std::mutex> lock(options_mutex());
  return current_options();
}

void set_options(const Options& options) {
  std::lock_guard<std::mutex> lock(options_mutex());
  current_options() = options;
}

}  // namespace selfattn::sim
