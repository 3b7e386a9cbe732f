// selfattn-bench --mode decode: attention_with_kv_cache over a paged cache, per path, batch, cache
// length, page size and new tokens per sequence. Decode reads each sequence's K and V once, so it
// is bandwidth-bound: the rate reported is bytes (K/V of the cached tokens read, q read, out
// written) per second, and its share of the device copy ceiling measured in the same run. With
// --prefill-rows, sequence 0 has a prefill chunk of new rows beside the others' decode rows, in one
// packed attention_with_kv_cache_varlen call (a continuous-batching step): the same bytes, and
// FLOPs summed over each sequence's own rows. With --kv-dtype e4m3|e5m2 the cache is FP8 with fp32
// scales per tensor (kv_cache.h), q and out stay --dtype: K/V bytes count one byte an element, the
// saving decode is after. With --check the first call of each case is compared with the double
// reference (accuracy.h), over the cache as the library reads it (each code's value x its scale).
// K and V rows may differ (--head-dim-v); --mla's latent cache keeps V as K's leading columns, one
// pool read once (DeepSeek's absorbed decode: 576 / 512, one kv head).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "accuracy.h"
#include "bench.h"
#include "selfattn/reference.h"

namespace selfattn_bench {
namespace {

using selfattn::DeviceBuffer;
using selfattn::KvAttentionOptions;
using selfattn::KvCache;
using selfattn::TensorView;

// Fills a device buffer with one random chunk repeated (a host copy of a 16 GiB pool would not fit
// comfortably) and returns the chunk: element i of the buffer holds chunk[i % chunk.size()],
// already rounded to the dtype, which is all --check needs to rebuild any part of it. An FP8 dtype
// stores each value's code over `fp8_scale` (kv_cache.h's quantization: the quotient in fp32, then
// round to nearest even) and the chunk holds what the library reads back, the code's value x scale.
std::vector<float> fill_random(DeviceBuffer<unsigned char>& buffer, DType dtype, std::mt19937_64& rng,
                               float fp8_scale = 1.0f) {
  const size_t element = selfattn::dtype_size(dtype);
  const size_t chunk_elements = std::min<size_t>(size_t(1) << 20, std::max<size_t>(buffer.size() / element, 1));
  std::vector<float> values(chunk_elements);
  std::vector<unsigned char> chunk(chunk_elements * element);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (size_t i = 0; i < chunk_elements; ++i) {
    if (selfattn::is_fp8(dtype)) {
      const uint8_t code = selfattn::reference::fp8_code(dtype, double(uniform(rng) / fp8_scale));
      chunk[i] = code;
      values[i] = float(selfattn::reference::fp8_value(dtype, code) * double(fp8_scale));
      continue;
    }
    values[i] = round_to(uniform(rng), dtype);
    if (dtype == DType::f32) {
      std::memcpy(chunk.data() + i * 4, &values[i], 4);
    } else {
      const uint16_t bits = to_half_bits(values[i], dtype);
      std::memcpy(chunk.data() + i * 2, &bits, 2);
    }
  }
  for (size_t offset = 0; offset < buffer.size(); offset += chunk.size())
    buffer.copy_from_host(chunk.data(), std::min(chunk.size(), buffer.size() - offset), offset);
  return values;
}

float element_of(const std::vector<float>& chunk, size_t index) { return chunk[index % chunk.size()]; }

// The sequences --check compares: all of them when the whole batch's reference is cheap, else the
// first, middle and last.
std::vector<int> checked_sequences(const Case& c, double whole_macs) {
  const double macs = double(c.batch) * c.heads * c.seq_q * c.seq_k * c.head_dim;
  std::vector<int> sequences;
  if (macs <= whole_macs) {
    for (int b = 0; b < c.batch; ++b) sequences.push_back(b);
  } else {
    sequences = {0, c.batch / 2, c.batch - 1};
    sequences.erase(std::unique(sequences.begin(), sequences.end()), sequences.end());
  }
  return sequences;
}

// The decode inputs as the device holds them: q [total rows, heads, d], out with dv (sequence b's
// new rows from first_row[b]: BSHD [batch, new_tokens, heads, d] when every sequence has
// new_tokens), the K/V pools [num_pages, page_size, kv_heads, d or dv] with each buffer's fill
// chunk (a latent cache's V: K's pool, its rows d long), and the block table.
struct DecodeHost {
  std::vector<float> q, k, v;
  int v_row = 0;  // elements between V rows' starts in v's pool: dv, or d for a latent cache
  std::vector<int32_t> table;
  std::vector<int32_t> first_row;  // [batch + 1]: the packed offsets
  int pages_per_seq = 0;
};

// Compares out (downloaded as [heads, total rows, d] floats) with the double reference, sequence by
// sequence: each checked sequence's q, K/V (gathered through the block table) and out as BHSD of
// batch 1, where decode attention is attention() with seq_k = cache_len, bottom-right
// (check_against_reference).
AccuracyResult check_decode(const Case& c, const DecodeHost& host, const std::vector<float>& out, double tolerance,
                            double whole_macs) {
  const DecodeShape& shape = *c.decode;
  const int d = c.head_dim, dv = v_dim(c);
  const size_t total_rows = size_t(host.first_row.back());
  AccuracyResult total;
  total.passed = true;
  const std::vector<int> sequences = checked_sequences(c, whole_macs);
  total.sampled = int(sequences.size()) < c.batch;
  Case one = c;
  one.batch = 1;
  for (int b : sequences) {
    one.seq_q = shape.rows_of(b);
    const size_t first = size_t(host.first_row[size_t(b)]);
    std::vector<float> q(size_t(c.heads) * one.seq_q * d), o(size_t(c.heads) * one.seq_q * dv);
    std::vector<float> k(size_t(c.kv_heads) * c.seq_k * d), v(size_t(c.kv_heads) * c.seq_k * dv);
    for (int h = 0; h < c.heads; ++h)
      for (int i = 0; i < one.seq_q; ++i) {
        const size_t row = (first + size_t(i)) * c.heads + size_t(h), bhsd = size_t(h) * one.seq_q + size_t(i);
        for (int e = 0; e < d; ++e) q[bhsd * d + size_t(e)] = element_of(host.q, row * d + size_t(e));
        for (int e = 0; e < dv; ++e)
          o[bhsd * dv + size_t(e)] = out[(size_t(h) * total_rows + first + size_t(i)) * dv + size_t(e)];
      }
    for (int t = 0; t < c.seq_k; ++t) {
      const size_t page = size_t(host.table[size_t(b) * host.pages_per_seq + size_t(t / shape.page_size)]);
      for (int h = 0; h < c.kv_heads; ++h) {
        const size_t slot = (page * shape.page_size + size_t(t % shape.page_size)) * c.kv_heads + size_t(h);
        const size_t bhsd = size_t(h) * c.seq_k + size_t(t);
        for (int e = 0; e < d; ++e) k[bhsd * d + size_t(e)] = element_of(host.k, slot * d + size_t(e));
        for (int e = 0; e < dv; ++e)
          v[bhsd * dv + size_t(e)] = element_of(host.v, slot * size_t(host.v_row) + size_t(e));
      }
    }
    const AccuracyResult part = check_against_reference(one, q, k, v, o, tolerance, whole_macs);
    total.max_abs_err = std::max(total.max_abs_err, part.max_abs_err);
    total.rel_err = std::max(total.rel_err, part.rel_err);
    total.sampled = total.sampled || part.sampled;
    if (!part.passed && total.passed) {
      total.passed = false;
      total.failure = "sequence " + std::to_string(b) + ": " + part.failure;
    }
  }
  return total;
}

// Each (new tokens, prefill rows) pair of the sweep.
std::vector<std::pair<int, int>> decode_steps(const DecodeSweep& sweep) {
  std::vector<std::pair<int, int>> steps;
  for (int new_tokens : sweep.new_tokens)
    for (int prefill_rows : sweep.prefill_rows) steps.emplace_back(new_tokens, prefill_rows);
  return steps;
}

void print_line(const CaseResult& r) {
  const Case& c = r.c;
  const DecodeShape& shape = *c.decode;
  const std::string rows = shape.prefill_rows > 0
                               ? std::to_string(shape.prefill_rows) + "+" + std::to_string(shape.new_tokens)
                               : std::to_string(shape.new_tokens);
  std::printf("%-7s %6d %8d %5d %6s %7s ", name(c.path), c.batch, shape.cache_len, shape.page_size, rows.c_str(),
              shape.splits ? std::to_string(shape.splits).c_str() : "auto");
  if (r.status != Status::ok && r.status != Status::check_failed) {
    std::printf(" %s: %s\n", r.status == Status::error ? "error" : "skipped", r.note.c_str());
    return;
  }
  char pct[16] = "-", err[16] = "-";
  if (r.pct_of_copy) std::snprintf(pct, sizeof pct, "%.1f", *r.pct_of_copy);
  if (r.checked) std::snprintf(err, sizeof err, "%.2e", r.rel_err);
  std::printf("%10.4f %9.3g %7s %9s %s\n", r.ms_median, r.gbps, pct, err,
              !r.checked ? "off" : r.status == Status::ok ? "pass" : ("FAIL: " + r.note).c_str());
}

}  // namespace

std::vector<CaseResult> run_decode(selfattn::Context& ctx, const DecodeSweep& sweep, const RunSettings& settings,
                                   const Ceilings& ceilings) {
  const DType dtype = sweep.dtype;
  const size_t element = selfattn::dtype_size(dtype);
  const DType kv_dtype = sweep.kv_dtype.value_or(dtype);
  const size_t kv_element = selfattn::dtype_size(kv_dtype);
  const bool fp8 = selfattn::is_fp8(kv_dtype);
  // An FP8 cache's per-tensor scales: the uniform(-1, 1) values over them stay well inside either
  // format's range (|x| / scale <= 171 and 103 < 448), and their few significant bits keep
  // code x scale exact in fp32, f16 and bf16, so --check's reference reads what the kernels read.
  const float k_scale = 0.375f / 64, v_scale = 0.625f / 64;
  std::string cache_text = name(kv_dtype);
  if (fp8) {
    char scales[96];
    std::snprintf(scales, sizeof scales, " (scales per tensor: k %g, v %g)", double(k_scale), double(v_scale));
    cache_text += scales;
  }
  const int head_dim_v = sweep.head_dim_v > 0 ? sweep.head_dim_v : sweep.head_dim;
  if (sweep.latent) cache_text += ", latent (V: K's first " + std::to_string(head_dim_v) + " columns)";
  std::printf("decode: %s, cache %s, %d query heads over %d kv heads, head_dim %d/%d, copy ceiling %s\n", name(dtype),
              cache_text.c_str(), sweep.heads, sweep.kv_heads, sweep.head_dim, head_dim_v,
              ceilings.copy_gbps > 0 ? (std::to_string(int(ceilings.copy_gbps)) + " GB/s").c_str() : "not measured");
  std::optional<DeviceBuffer<float>> scales;
  if (fp8) {
    scales.emplace(ctx, 2, "decode kv scales");
    scales->copy_from_host(std::vector<float>{k_scale, v_scale});
  }
  std::printf("%-7s %6s %8s %5s %6s %7s %10s %9s %7s %9s %s\n", "path", "batch", "cache", "page", "new", "splits", "ms",
              "GB/s", "%copy", "rel_err", "check");
  std::mt19937_64 rng(2024);
  std::vector<CaseResult> results;
  for (int page_size : sweep.page_sizes) {
    for (int batch : sweep.batches) {
      for (int cache_len : sweep.cache_lengths) {
        for (const auto& [new_tokens, prefill_rows] : decode_steps(sweep)) {
          Case c;
          c.dtype = dtype;
          c.batch = batch;
          c.heads = sweep.heads;
          c.kv_heads = sweep.kv_heads;
          c.seq_q = new_tokens;
          c.seq_k = cache_len;
          c.head_dim = sweep.head_dim;
          c.head_dim_v = sweep.head_dim_v;
          c.causal = Causal::bottom_right;
          c.layout = Layout::bshd;
          c.decode = DecodeShape{cache_len, page_size, new_tokens, sweep.splits, prefill_rows, kv_dtype, sweep.latent};
          // The cache holds cache_len tokens per sequence (the new ones among them, appended before).
          DecodeHost host;
          host.first_row.assign(1, 0);
          for (int b = 0; b < batch; ++b) host.first_row.push_back(host.first_row.back() + c.decode->rows_of(b));
          const int total_rows = host.first_row.back();
          const bool packed = prefill_rows > 0;
          host.pages_per_seq = (cache_len + page_size - 1) / page_size;
          const int num_pages = batch * host.pages_per_seq;
          const size_t pool_slots = size_t(num_pages) * page_size * sweep.kv_heads;
          std::optional<DeviceBuffer<unsigned char>> k_pool, v_pool;
          try {
            k_pool.emplace(ctx, pool_slots * sweep.head_dim * kv_element, "decode k pool");
            if (!sweep.latent) v_pool.emplace(ctx, pool_slots * head_dim_v * kv_element, "decode v pool");
          } catch (const std::exception& e) {
            for (Path path : sweep.paths) {
              CaseResult r;
              r.c = c;
              r.c.path = path;
              r.resolved_path = name(path);
              r.note = std::string("cache pool: ") + e.what();
              print_line(r);
              results.push_back(r);
            }
            continue;
          }
          host.k = fill_random(*k_pool, kv_dtype, rng, k_scale);
          host.v = sweep.latent ? host.k : fill_random(*v_pool, kv_dtype, rng, v_scale);
          host.v_row = sweep.latent ? sweep.head_dim : head_dim_v;
          host.table.resize(size_t(num_pages));
          std::iota(host.table.begin(), host.table.end(), 0);
          std::shuffle(host.table.begin(), host.table.end(), rng);  // pages in any order, as an engine's allocator leaves them
          DeviceBuffer<int32_t> block_table(ctx, host.table.size(), "block table"), lengths(ctx, size_t(batch), "lengths");
          block_table.copy_from_host(host.table);
          lengths.copy_from_host(std::vector<int32_t>(size_t(batch), cache_len));
          const TensorView k =
              TensorView::bshd(k_pool->data(), kv_dtype, num_pages, sweep.kv_heads, page_size, sweep.head_dim);
          TensorView v = k;  // latent: K's view with its first head_dim_v columns
          v.shape[3] = head_dim_v;
          if (!sweep.latent)
            v = TensorView::bshd(v_pool->data(), kv_dtype, num_pages, sweep.kv_heads, page_size, head_dim_v);
          KvCache cache = KvCache::paged_pool(k, v, block_table.data(), batch, host.pages_per_seq, lengths.data());
          if (fp8) {  // a latent cache's V is K's values: K's scale
            cache.k_scale = scales->data();
            cache.v_scale = sweep.latent ? scales->data() : scales->data() + 1;
            cache.scale_count = 1;
          }
          const size_t q_elements = size_t(total_rows) * sweep.heads * sweep.head_dim;
          const size_t out_elements = size_t(total_rows) * sweep.heads * head_dim_v;
          DeviceBuffer<unsigned char> q(ctx, q_elements * element, "q"), out(ctx, out_elements * element, "out");
          host.q = fill_random(q, dtype, rng);
          // Dense: [batch, new_tokens, heads, d]; packed: [1, total_rows, heads, d], the same bytes
          // when every sequence has new_tokens rows.
          const int view_batch = packed ? 1 : batch, view_rows = packed ? total_rows : new_tokens;
          const TensorView q_view =
              TensorView::bshd(q.data(), dtype, view_batch, sweep.heads, view_rows, sweep.head_dim);
          const TensorView out_view =
              TensorView::bshd(out.data(), dtype, view_batch, sweep.heads, view_rows, head_dim_v);
          DeviceBuffer<int32_t> cu_seqlens(ctx, host.first_row.size(), "cu_seqlens_q");
          cu_seqlens.copy_from_host(host.first_row);
          const int max_rows = std::max(prefill_rows, new_tokens);
          for (Path path : sweep.paths) {
            CaseResult r;
            r.c = c;
            r.c.path = path;
            r.resolved_path = name(path);
            r.status = Status::ok;
            KvAttentionOptions options;
            options.path = path;
            options.num_splits = sweep.splits;
            const auto call = [&] {
              if (packed) {
                selfattn::attention_with_kv_cache_varlen(ctx, q_view, cu_seqlens.data(), max_rows, cache, out_view,
                                                         options);
              } else {
                selfattn::attention_with_kv_cache(ctx, q_view, cache, out_view, options);
              }
            };
            try {
              // The first call is the checked one: out poisoned with NaN so an unwritten element shows.
              out.fill_bytes(0xFF);
              call();
              ctx.synchronize();
              if (settings.check) {
                Case rows = r.c;  // out as [1, total rows, heads, d]: read back as [heads, total rows, d]
                rows.batch = 1;
                rows.seq_q = total_rows;
                const std::vector<float> values = from_device_bytes(out.to_host(), rows, v_dim(rows));
                record_check(check_decode(r.c, host, values, settings.tolerance.value_or(default_tolerance(dtype)),
                                          settings.whole_check_macs),
                             r);
              }
              for (int i = 0; i < settings.warmup; ++i) call();
              CallTimer timer(ctx);
              for (int i = 0; i < settings.iters; ++i) {
                timer.begin();
                call();
                timer.end();
              }
              std::vector<double> ms = timer.collect_ms();
              std::sort(ms.begin(), ms.end());
              r.ms_min = ms.front();
              r.ms_max = ms.back();
              r.ms_median = ms[ms.size() / 2];
              // K/V read + q read + out written; FLOPs of each sequence's own rows (measure.cpp).
              r.gbps = attention_bytes(r.c) / (r.ms_median * 1e-3) / 1e9;
              r.tflops = attention_flops(r.c) / (r.ms_median * 1e-3) / 1e12;
              if (ceilings.copy_gbps > 0) r.pct_of_copy = 100.0 * r.gbps / ceilings.copy_gbps;
              // --profile: one more call, after the timed ones (bench/README.md).
              if (!settings.profile_gpu.empty()) r.profile = profile_call(call, settings.profile_gpu);
            } catch (const selfattn::WorkspaceTooSmall& e) {
              // naive and cublas gather the whole cache into the workspace: large sweeps outgrow it.
              r.status = Status::skipped;
              r.note = e.what();
            } catch (const std::exception& e) {
              r.status = Status::error;
              r.note = e.what();
            }
            print_line(r);
            results.push_back(r);
          }
        }
      }
    }
  }
  int ran = 0, errors = 0, failed = 0;
  for (const CaseResult& r : results) {
    ran += r.status == Status::ok || r.status == Status::check_failed;
    errors += r.status == Status::error;
    failed += r.status == Status::check_failed;
  }
  std::printf("%d of %zu decode cases ran, %d errors, %d failed the check\n", ran, results.size(), errors, failed);
  return results;
}

void apply_mla_preset(DecodeSweep& sweep, Backend backend) {
  sweep.heads = 128;
  sweep.kv_heads = 1;
  sweep.head_dim = 576;
  sweep.head_dim_v = 512;
  sweep.latent = true;
  sweep.page_sizes = {64};
  if (backend == Backend::cuda) {
    sweep.batches = {1, 8, 32, 128};
    sweep.cache_lengths = {1024, 4096, 16384, 32768};
  } else {
    sweep.heads = 16;
    sweep.batches = {2};
    sweep.cache_lengths = {97};
  }
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
