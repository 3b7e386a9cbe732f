#pragma once
// What an append (append_kv, append_kv_varlen) must leave in a cache, checked the same way by the
// dense and the packed tests (kv_cache/test_kv_cache_append.cpp, test_kv_cache_varlen_append.cpp):
// the rows the new tokens target hold the reference's values (K rotated in fp32 and rounded once,
// V and unrotated K copied exactly), and every other byte of the device buffers - other rows, row
// padding, rows of the allocation past the cache's view - is what it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kv_cache_check.h"

namespace selfattn::kv_test {

// The pool rows (page * page_size + row) that `counts[b]` new tokens of each sequence b of `cache`
// target: positions length(b) .. length(b) + counts[b] - 1, each in its page (none past the
// capacity or in a page outside the pool).
inline std::vector<char> append_targets(const reference::KvCacheImage& cache, const std::vector<int>& counts) {
  std::vector<char> target(size_t(cache.num_pages) * size_t(cache.page_size), 0);
  for (int b = 0; b < cache.batch; ++b)
    for (int t = 0; t < counts[size_t(b)]; ++t) {
      const int position = cache.length(b) + t;
      const int page = cache.page_of(b, position);
      if (page >= 0) target[size_t(page) * size_t(cache.page_size) + size_t(position % cache.page_size)] = 1;
    }
  return target;
}

// Compares the device pools of `cache` after an append with `expected` (the reference's append
// on the image as it was) at the `target` rows of append_targets(), and every other byte of K's and
// V's device buffers with `k_before` / `v_before`. With `rotary`, K's first rotary_dim elements were
// rotated in fp32 and rounded once: x cos - y sin rounds in proportion to |x cos| + |y sin| <=
// sqrt(2) |(x, y)|, the norm of its own pair (a rotation keeps it; the rotated value may be far
// smaller). Everything else is an exact copy.
inline ::testing::AssertionResult check_appended_pools(const std::string& name, const TestCache& cache,
                                                       const reference::KvCacheImage& expected,
                                                       const std::vector<unsigned char>& k_before,
                                                       const std::vector<unsigned char>& v_before,
                                                       const std::vector<char>& target,
                                                       const reference::RotaryTable* rotary) {
  const DType dtype = cache.spec.dtype;
  const size_t element = dtype_size(dtype);
  // A V that is a view of K has no bytes of its own: K's check covers them (V's image is K's leading columns).
  for (int which = 0; which < (cache.spec.v_in_k ? 1 : 2); ++which) {
    const std::vector<unsigned char>& before = which == 0 ? k_before : v_before;
    const std::vector<unsigned char> after = cache.buffer(which).to_host();
    const std::vector<double>& image = which == 0 ? expected.k : expected.v;
    const int d = cache.spec.dim(which);
    std::vector<char> written_byte(after.size(), 0);
    std::vector<float> written;
    std::vector<double> wanted;
    for (int page = 0; page < expected.num_pages; ++page)
      for (int h = 0; h < expected.kv_heads; ++h)
        for (int row = 0; row < expected.page_size; ++row) {
          if (!target[size_t(page) * size_t(expected.page_size) + size_t(row)]) continue;
          for (int e = 0; e < d; ++e) {
            const size_t index = cache.device_index(which, page, h, row, e);
            std::memset(written_byte.data() + index * element, 1, element);
            written.push_back(load_element(after.data(), dtype, index));
            wanted.push_back(image[(which == 0 ? expected.offset(page, h, row) : expected.v_offset(page, h, row)) +
                                   size_t(e)]);
          }
        }
    for (size_t byte = 0; byte < after.size(); ++byte) {
      if (!written_byte[byte] && after[byte] != before[byte]) {
        return ::testing::AssertionFailure() << name << ": cache " << (which ? "v" : "k") << " byte " << byte
                                             << " (element " << byte / element << ") changed but is no new token's";
      }
    }
    testing::Expected judged = exact_copy(wanted);
    if (rotary && which == 0) {
      const size_t rotary_dim = size_t(rotary->rotary_dim), first = size_t(rotary->first_dim);
      // The partner of rotated element e, both counted from first_dim.
      const auto partner = [&](size_t e) {
        if (rotary->interleaved) return e ^ 1;
        return e < rotary_dim / 2 ? e + rotary_dim / 2 : e - rotary_dim / 2;
      };
      for (size_t row = 0; row < wanted.size() / size_t(d); ++row)
        for (size_t e = 0; e < rotary_dim; ++e) {
          const size_t i = row * size_t(d) + first + e, j = row * size_t(d) + first + partner(e);
          judged.allowed[i] = round_to(dtype, float(wanted[i]));
          judged.scale[i] = std::sqrt(2 * (wanted[i] * wanted[i] + wanted[j] * wanted[j]));
          judged.floor[i] = testing::rounding_floor(dtype, 4, judged.scale[i]);
        }
    }
    ::testing::AssertionResult result = judge_values(name + (which ? " v" : " k"), written, judged);
    if (!result) return result;
  }
  return ::testing::AssertionSuccess();
}

// updated_lengths as an append of counts[b] tokens must leave it: min(length(b) + counts[b],
// capacity) for each sequence, and `spare` entries after them untouched (their bytes 0xff).
inline ::testing::AssertionResult check_updated_lengths(const std::string& name, const std::vector<int32_t>& updated,
                                                        const reference::KvCacheImage& cache,
                                                        const std::vector<int>& counts) {
  for (size_t b = 0; b < updated.size(); ++b) {
    const int32_t wanted = b < size_t(cache.batch) ? std::min(cache.length(int(b)) + counts[b], cache.capacity()) : -1;
    if (updated[b] != wanted) {
      return ::testing::AssertionFailure() << name << ": updated_lengths[" << b << "] = " << updated[b] << ", expected "
                                           << wanted << (b < size_t(cache.batch) ? "" : " (past the batch: untouched)");
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace selfattn::kv_test
