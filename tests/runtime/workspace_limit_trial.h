#pragma once
// What the workspace-limit programs (test_workspace_limit_*.cpp) share: one call with its memory
// and its judge (Trial), run under a limit; the needs of context.h's rule restated; the judging
// helpers; and the random trials under random limits that the property tests run.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attention_expected.h"
#include "attention_harness.h"
#include "self_attention_reference.h"
#include "selfattn/selfattn.h"

namespace selfattn::workspace_limit_test {

using host_test::upload;
using testing::load_element;
using testing::round_to;

constexpr unsigned char kUnwritten = 0xFF;  // NaN in every dtype: an element left unwritten shows

inline size_t round_up(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Workspace bytes one query row with `seq_k` keys needs on `path` (context.h).
inline size_t score_row_bytes(Path path, DType dtype, int seq_k) {
  if (path == Path::fused) return 0;
  size_t bytes = 4 * round_up(size_t(seq_k), 4);  // fp32 S, P over it
  if (path == Path::cublas && dtype != DType::f32) bytes += 2 * round_up(size_t(seq_k), 8);  // P in dtype
  return std::max<size_t>(bytes, 16);
}

// One call with its memory and its judge, run under many limits.
struct Trial {
  std::string name;
  const char* function = "";  // the entry point the messages must name
  size_t need = 0;            // bytes with a chunk of one query row
  size_t whole = 0;           // bytes with the whole problem in one chunk
  std::vector<DeviceBuffer<unsigned char>> inputs, outputs;
  // Output i starts each run as initial_outputs[i] where given (a cache append_kv writes into),
  // else poisoned.
  std::vector<std::vector<unsigned char>> initial_outputs;
  std::function<void(Context&, const Trial&)> call;  // the Trial passes itself: its buffers
  // After a success: outputs (as downloaded) against the reference.
  std::function<::testing::AssertionResult(const std::vector<std::vector<unsigned char>>&)> judge;
};

inline std::vector<std::vector<unsigned char>> contents(const std::vector<DeviceBuffer<unsigned char>>& buffers) {
  std::vector<std::vector<unsigned char>> bytes;
  for (const auto& buffer : buffers) bytes.push_back(buffer.to_host());
  return bytes;
}

// Where two snapshots differ first ("buffer 1 byte 40"), or "" when they are equal.
inline std::string first_difference(const std::vector<std::vector<unsigned char>>& a,
                             const std::vector<std::vector<unsigned char>>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j)
      if (a[i][j] != b[i][j]) return "buffer " + std::to_string(i) + " byte " + std::to_string(j);
  return "";
}

inline ::testing::AssertionResult run_under_limit(Context& ctx, Trial& trial, size_t limit) {
  for (size_t i = 0; i < trial.outputs.size(); ++i) {
    if (i < trial.initial_outputs.size() && !trial.initial_outputs[i].empty()) {
      trial.outputs[i].copy_from_host(trial.initial_outputs[i]);
    } else {
      trial.outputs[i].fill_bytes(kUnwritten);
    }
  }
  ctx.set_workspace_limit(limit);
  const auto inputs_before = contents(trial.inputs), outputs_before = contents(trial.outputs);
  const std::string where = trial.name + " under limit " + std::to_string(limit) + " (one row needs " +
                            std::to_string(trial.need) + ")";
  try {
    trial.call(ctx, trial);
    ctx.synchronize();
  } catch (const WorkspaceTooSmall& e) {
    const std::string message = e.what();
    if (limit >= trial.need) return ::testing::AssertionFailure() << where << ": threw " << message;
    const std::string written = first_difference(outputs_before, contents(trial.outputs));
    if (!written.empty()) return ::testing::AssertionFailure() << where << ": threw, but wrote output " << written;
    const std::string changed = first_difference(inputs_before, contents(trial.inputs));
    if (!changed.empty()) return ::testing::AssertionFailure() << where << ": threw, but changed input " << changed;
    if (message.rfind(std::string(trial.function) + ": ", 0) != 0 ||
        message.find(" " + std::to_string(limit) + " bytes") == std::string::npos)
      return ::testing::AssertionFailure() << where << ": the message should start with " << trial.function
                                           << " and name the limit: " << message;
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << where << ": threw " << e.what();
  }
  if (limit < trial.need) return ::testing::AssertionFailure() << where << ": ran although one row does not fit";
  if (ctx.workspace_bytes() > limit)
    return ::testing::AssertionFailure() << where << ": the workspace holds " << ctx.workspace_bytes() << " bytes";
  const std::string changed = first_difference(inputs_before, contents(trial.inputs));
  if (!changed.empty()) return ::testing::AssertionFailure() << where << ": input " << changed << " changed";
  ::testing::AssertionResult verdict = trial.judge(contents(trial.outputs));
  if (!verdict) verdict << " (" << where << ")";
  return verdict;
}

// ---- judging ----

// out (elements of dtype) and lse (fp32), in the order of the expectations, by the shared rule
// (judge.h).
inline ::testing::AssertionResult matches(const std::vector<unsigned char>& out, DType dtype, const testing::Expected& out_expected,
                                   const std::vector<unsigned char>& lse, const testing::Expected& lse_expected) {
  std::vector<double> out_values(out_expected.size()), lse_values(lse_expected.size());
  for (size_t i = 0; i < out_values.size(); ++i) out_values[i] = load_element(out.data(), dtype, i);
  for (size_t i = 0; i < lse_values.size(); ++i) lse_values[i] = load_element(lse.data(), DType::f32, i);
  ::testing::AssertionResult verdict = testing::judge("out", out_values, out_expected);
  return verdict ? testing::judge("lse", lse_values, lse_expected) : verdict;
}

// Copies `rows` rows of `from` starting at row `from_row` to row `to_row` of `to` (same row length).
inline void place_rows(const testing::Expected& from, size_t from_row, testing::Expected& to, size_t to_row, size_t rows) {
  const size_t n = size_t(from.row_length);
  for (auto member : {&testing::Expected::exact, &testing::Expected::allowed, &testing::Expected::scale,
                      &testing::Expected::floor}) {
    std::copy_n((from.*member).begin() + ptrdiff_t(from_row * n), rows * n, (to.*member).begin() + ptrdiff_t(to_row * n));
  }
}

inline std::vector<double> random_values(size_t n, DType dtype, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<double> values(n);
  for (double& x : values) x = round_to(dtype, uniform(rng));
  return values;
}

// The bytes of `values` in a device buffer (int32 metadata, fp32 tables).
template <class T>
DeviceBuffer<unsigned char> upload_raw(Context& ctx, const std::vector<T>& values) {
  DeviceBuffer<unsigned char> buffer(ctx, values.size() * sizeof(T));
  if (!values.empty()) buffer.copy_from_host(reinterpret_cast<const unsigned char*>(values.data()), buffer.size());
  return buffer;
}
inline DeviceBuffer<unsigned char> upload_int32(Context& ctx, const std::vector<int32_t>& values) { return upload_raw(ctx, values); }

inline std::vector<int32_t> int32_values(const std::vector<unsigned char>& bytes) {
  std::vector<int32_t> values(bytes.size() / sizeof(int32_t));
  if (!values.empty()) std::memcpy(values.data(), bytes.data(), values.size() * sizeof(int32_t));
  return values;
}

inline std::string label(DType dtype, Path path) { return std::string(to_string(dtype)) + " " + to_string(path); }
// ---- the property: random limits, every path and entry point ----

// Limits from below one row to above the whole problem, the boundary among them.
inline std::vector<size_t> limits_for(const Trial& trial, std::mt19937& rng) {
  std::vector<size_t> limits{trial.need};
  if (trial.need > 0) limits.push_back(trial.need - 1);
  std::uniform_int_distribution<size_t> around(trial.need / 2, trial.whole + trial.whole / 4 + 1);
  limits.push_back(around(rng));
  limits.push_back(around(rng));
  return limits;
}

inline uint32_t run_seed() {
  const char* seed = std::getenv("SELFATTN_SIM_SEED");
  return seed ? uint32_t(std::strtoul(seed, nullptr, 10)) : 1u;
}

template <class T>
T pick(std::mt19937& rng, std::initializer_list<T> values) {
  return *(values.begin() + std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng));
}
inline int between(std::mt19937& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

constexpr int kTrialsPerPath = 4;

inline DType random_dtype(std::mt19937& rng) { return pick(rng, {DType::f32, DType::f16, DType::bf16}); }
inline Causal random_causal(std::mt19937& rng) { return pick(rng, {Causal::none, Causal::top_left, Causal::bottom_right}); }

// kTrialsPerPath random trials (make_trial), each under limits_for(), all on one context: what
// earlier calls left in the workspace must not matter.
inline void check_random_trials(Path path, uint32_t salt, const std::function<Trial(Context&, std::mt19937&)>& make_trial) {
  Context ctx(Backend::sim);
  std::mt19937 rng(run_seed() * salt + unsigned(path));
  for (int i = 0; i < kTrialsPerPath; ++i) {
    Trial trial = make_trial(ctx, rng);
    for (size_t limit : limits_for(trial, rng)) EXPECT_TRUE(run_under_limit(ctx, trial, limit));
  }
}

class WorkspaceLimitProperty : public ::testing::TestWithParam<Path> {};

}  // namespace selfattn::workspace_limit_test
