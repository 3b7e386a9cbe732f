// selfattn-bench --mode decode: attention_with_kv_cache over a paged cache, per path, batch, cache
// length, page size and new tokens per sequence. Decode reads each sequence's K and V once, so it
// is bandwidth-bound: the rate reported is bytes (K/V of the cached tokens read, q read, out
// written) per second, and its share of the device copy ceiling measured in the same run.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench.h"

namespace selfattn_bench {
namespace {

using selfattn::DeviceBuffer;
using selfattn::KvAttentionOptions;
using selfattn::KvCache;
using selfattn::TensorView;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Fills a device buffer with one random chunk repeated (the values do not matter to the timing,
// but they must be finite; a host copy of a 16 GiB pool would not fit comfortably).
void fill_random(DeviceBuffer<unsigned char>& buffer, DType dtype, std::mt19937_64& rng) {
  const size_t chunk_elements = size_t(1) << 20, element = selfattn::dtype_size(dtype);
  std::vector<unsigned char> chunk(chunk_elements * element);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (size_t i = 0; i < chunk_elements; ++i) {
    const float value = uniform(rng);
    if (dtype == DType::f32) {
      std::memcpy(chunk.data() + i * 4, &value, 4);
    } else {
      // f16 and bf16 bit patterns of small finite values: bf16 is the top half of the float;
      // for f16 take a value in [-1, 1) built from sign, exponent 14 (0.5..1) and random mantissa.
      uint32_t bits;
      std::memcpy(&bits, &value, 4);
      const uint16_t half = dtype == DType::bf16 ? uint16_t(bits >> 16)
                                                 : uint16_t(((bits >> 16) & 0x8000u) | (14u << 10) | (bits & 0x3ffu));
      std::memcpy(chunk.data() + i * 2, &half, 2);
    }
  }
  for (size_t offset = 0; offset < buffer.size(); offset += chunk.size())
    buffer.copy_from_host(chunk.data(), std::min(chunk.size(), buffer.size() - offset), offset);
}

}  // namespace

int run_decode(selfattn::Context& ctx, const DecodeSweep& sweep, const RunSettings& settings,
               const Ceilings& ceilings) {
  const DType dtype = sweep.dtype;
  const size_t element = selfattn::dtype_size(dtype);
  std::printf("decode: %s, %d query heads over %d kv heads, head_dim %d, copy ceiling %s\n", name(dtype), sweep.heads,
              sweep.kv_heads, sweep.head_dim,
              ceilings.copy_gbps > 0 ? (std::to_string(int(ceilings.copy_gbps)) + " GB/s").c_str() : "not measured");
  std::printf("%-7s %6s %8s %5s %4s %7s %10s %9s %7s\n", "path", "batch", "cache", "page", "new", "splits", "ms",
              "GB/s", "%copy");
  std::mt19937_64 rng(2024);
  int ran = 0, errors = 0, total = 0;
  for (int page_size : sweep.page_sizes) {
    for (int batch : sweep.batches) {
      for (int cache_len : sweep.cache_lengths) {
        for (int new_tokens : sweep.new_tokens) {
          // The cache holds cache_len tokens per sequence (the new ones among them, appended before).
          const int pages_per_seq = (cache_len + page_size - 1) / page_size;
          const int num_pages = batch * pages_per_seq;
          const size_t pool_elements = size_t(num_pages) * page_size * sweep.kv_heads * sweep.head_dim;
          std::optional<DeviceBuffer<unsigned char>> k_pool, v_pool;
          try {
            k_pool.emplace(ctx, pool_elements * element, "decode k pool");
            v_pool.emplace(ctx, pool_elements * element, "decode v pool");
          } catch (const std::exception& e) {
            std::printf("%-7s %6d %8d %5d %4d  skipped: %s\n", "-", batch, cache_len, page_size, new_tokens, e.what());
            continue;
          }
          fill_random(*k_pool, dtype, rng);
          fill_random(*v_pool, dtype, rng);
          std::vector<int32_t> table(static_cast<size_t>(num_pages));
          std::iota(table.begin(), table.end(), 0);
          std::shuffle(table.begin(), table.end(), rng);  // pages in any order, as an engine's allocator leaves them
          DeviceBuffer<int32_t> block_table(ctx, table.size(), "block table"), lengths(ctx, size_t(batch), "lengths");
          block_table.copy_from_host(table);
          lengths.copy_from_host(std::vector<int32_t>(size_t(batch), cache_len));
          const TensorView k = TensorView::bshd(k_pool->data(), dtype, num_pages, sweep.kv_heads, page_size, sweep.head_dim);
          const TensorView v = TensorView::bshd(v_pool->data(), dtype, num_pages, sweep.kv_heads, page_size, sweep.head_dim);
          const KvCache cache = KvCache::paged_pool(k, v, block_table.data(), batch, pages_per_seq, lengths.data());
          const size_t q_elements = size_t(batch) * sweep.heads * new_tokens * sweep.head_dim;
          DeviceBuffer<unsigned char> q(ctx, q_elements * element, "q"), out(ctx, q_elements * element, "out");
          fill_random(q, dtype, rng);
          const TensorView q_view = TensorView::bshd(q.data(), dtype, batch, sweep.heads, new_tokens, sweep.head_dim);
          const TensorView out_view = TensorView::bshd(out.data(), dtype, batch, sweep.heads, new_tokens, sweep.head_dim);
          const double bytes = double(batch) * cache_len * sweep.kv_heads * sweep.head_dim * 2 * element +
                               2.0 * double(q_elements) * element;
          for (Path path : sweep.paths) {
            ++total;
            KvAttentionOptions options;
            options.path = path;
            options.num_splits = sweep.splits;
            try {
              for (int i = 0; i < settings.warmup; ++i) selfattn::attention_with_kv_cache(ctx, q_view, cache, out_view, options);
              CallTimer timer(ctx);
              for (int i = 0; i < settings.iters; ++i) {
                timer.begin();
                selfattn::attention_with_kv_cache(ctx, q_view, cache, out_view, options);
                timer.end();
              }
              const double ms = median(timer.collect_ms());
              const double gbps = bytes / (ms * 1e-3) / 1e9;
              char pct[16] = "-";
              if (ceilings.copy_gbps > 0) std::snprintf(pct, sizeof pct, "%.1f", 100.0 * gbps / ceilings.copy_gbps);
              std::printf("%-7s %6d %8d %5d %4d %7s %10.4f %9.3g %7s\n", name(path), batch, cache_len, page_size,
                          new_tokens, sweep.splits ? std::to_string(sweep.splits).c_str() : "auto", ms, gbps, pct);
              ++ran;
            } catch (const selfattn::WorkspaceTooSmall& e) {
              // naive and cublas gather the whole cache into the workspace: large sweeps outgrow it.
              std::printf("%-7s %6d %8d %5d %4d  skipped: %s\n", name(path), batch, cache_len, page_size, new_tokens, e.what());
            } catch (const std::exception& e) {
              std::printf("%-7s %6d %8d %5d %4d  error: %s\n", name(path), batch, cache_len, page_size, new_tokens, e.what());
              ++errors;
            }
          }
        }
      }
    }
  }
  std::printf("%d of %d decode cases ran, %d errors\n", ran, total, errors);
  return errors ? 1 : 0;
}

DecodeSweep default_decode_sweep(Backend backend) {
  DecodeSweep sweep;
  if (backend == Backend::cuda) {
    // The sweep: bf16, d 128, 32 query heads over 8 kv heads (Llama-3-8B's attention).
    sweep.batches = {1, 8, 64, 128};
    sweep.cache_lengths = {1024, 4096, 16384, 32768};
    sweep.page_sizes = {16, 64};
  } else {
    sweep.heads = 4;
    sweep.kv_heads = 2;
    sweep.head_dim = 64;
    sweep.batches = {1, 3};
    sweep.cache_lengths = {33, 257};
    sweep.page_sizes = {16};
  }
  return sweep;
}

}  // namespace selfattn_bench
