#pragma once
// Building blocks of the KV-cache tests (kv_cache/test_kv_cache*.cpp and the KV-cache calls in
// validation/ and runtime/): a cache in device memory with its double-precision image for
// selfattn::reference (K and V each in its own layout), random rounded tensors (kv_tensors.h: every tensor of a call in its own layout), and the one
// judge every check goes through (the shared rule of judge.h), against what kv_cache_expected.h
// computes (its own header, included here).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attention_expected.h"
#include "attention_harness.h"
#include "kv_cache_expected.h"
#include "kv_tensors.h"
#include "score_mods_case.h"
#include "selfattn/selfattn.h"

namespace selfattn::kv_test {

using testing::load_element;
using testing::round_to;
using testing::store_element;

// ---- the judge ---------------------------------------------------------------------------------
// Every check goes through the shared rule (judge.h): the exact result beside the result computed
// again the way the library may (attention_expected.h), so the tolerance comes from the arithmetic.

// Judges float results (as downloaded) against `expected`.
inline ::testing::AssertionResult judge_values(const std::string& what, const std::vector<float>& actual,
                                               const testing::Expected& expected) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << what << ": " << actual.size() << " values, expected " << expected.size();
  }
  return testing::judge(what, std::vector<double>(actual.begin(), actual.end()), expected);
}

// A stored copy of values the device holds exactly (a cache row without rotary): equal or wrong.
inline testing::Expected exact_copy(const std::vector<double>& values) {
  testing::Expected e;
  e.exact = e.allowed = values;
  e.scale.assign(values.size(), 0.0);
  e.floor.assign(values.size(), 0.0);
  for (size_t i = 0; i < values.size(); ++i) e.scale[i] = std::abs(values[i]);
  return e;
}

// ---- seeds (the device tensors themselves: kv_tensors.h) ---------------------------------------

inline std::mt19937_64 rng_for(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (char ch : name) h = (h ^ uint8_t(ch)) * 1099511628211ull;
  const char* env = std::getenv("SELFATTN_SIM_SEED");
  return std::mt19937_64(h ^ (env ? std::strtoull(env, nullptr, 10) : 1) * 0x9E3779B97F4A7C15ull);
}

// ---- a cache -----------------------------------------------------------------------------------

struct CacheSpec {
  DType dtype = DType::f16;
  int batch = 1, kv_heads = 1, head_dim = 64;
  // V's rows where they differ from K's (0: head_dim); with v_in_k, V is a view of K's leading
  // head_dim_v columns (a latent cache: no pool of its own, v_layout unused).
  int head_dim_v = 0;
  bool v_in_k = false;
  bool paged = true;
  // The pools' layouts ([pages, kv_heads, page_size, d] viewed), K's and V's each their own.
  Layout k_layout{/*head_major=*/true, kCacheKeysPad}, v_layout{/*head_major=*/false, kCacheValuesPad};
  int page_size = 16;         // contiguous: the capacity
  int max_pages_per_seq = 1;  // paged only
  int extra_pages = 2;        // unused pages in the pool (paged)
  bool shared_first_page = false;  // every sequence's first page is sequence 0's (a common prefix)
  bool poison_unused = true;       // rows no sequence's length covers hold NaN (else random values)
  std::vector<int32_t> lengths;
  // Empty, or [batch]: each sequence's left padding (KvAttentionOptions::key_start); rows before it
  // hold NaN like unused rows.
  std::vector<int32_t> key_start;
  // Contiguous only, empty or [batch]: sequence b's row of a cache of cache_rows rows
  // (KvCache::batch_index; rows outside [0, cache_rows) read as no token).
  std::vector<int32_t> batch_index;
  int cache_rows = 0;
  // FP8 caches (dtype e4m3 or e5m2): K's and V's scales, 1 (per tensor) or kv_heads (per kv head).
  // Stored codes are the values drawn divided by the scale, rounded to FP8 (reference::fp8_code);
  // the image holds code x scale. Tests take scales of few significant bits (0.375, 0.625, 1.25...)
  // so that code x scale is exact in fp32, f16 and bf16 alike: the paths' dequantization (fp32 in
  // the split-KV kernel, q's dtype in the gather) then adds no rounding of its own.
  std::vector<float> k_scale, v_scale;

  int v_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  // K's (which 0) or V's (1) head dim.
  int dim(int which) const { return which == 0 ? head_dim : v_dim(); }

  // The scale of kv head h of K (which 0) or V (1); 1 for caches without scales.
  double scale(int which, int h) const {
    const std::vector<float>& scales = which == 0 || v_in_k ? k_scale : v_scale;  // a view of K: K's
    return scales.empty() ? 1.0 : scales[scales.size() == 1 ? 0 : size_t(h)];
  }

  std::string name() const {
    std::string s = std::string(to_string(dtype)) + (paged ? " paged ps" : " contiguous cap") + std::to_string(page_size) +
                    (paged ? "x" + std::to_string(max_pages_per_seq) : "") + " k " + k_layout.name() + " v " + v_layout.name() +
                    " kv" + std::to_string(kv_heads) + " d" + std::to_string(head_dim) +
                    (head_dim_v > 0 ? "/" + std::to_string(head_dim_v) : "") + (v_in_k ? " v_in_k" : "") + " len=[";
    for (int32_t n : lengths) s += std::to_string(n) + ",";
    s += "]";
    if (!batch_index.empty()) {
      s += " rows" + std::to_string(cache_rows) + "=[";
      for (int32_t r : batch_index) s += std::to_string(r) + ",";
      s += "]";
    }
    if (!k_scale.empty()) {
      s += " scales" + std::string(k_scale.size() == 1 ? "/tensor" : "/head") + " k=";
      for (float x : k_scale) s += std::to_string(x).substr(0, 5) + ",";
      s += " v=";
      for (float x : v_scale) s += std::to_string(x).substr(0, 5) + ",";
    }
    return s + (shared_first_page ? " shared" : "");
  }
};

// A cache in device memory and its image. Pool rows that no sequence's length covers hold NaN,
// so a kernel that reads past a length is caught by the comparison.
struct TestCache {
  CacheSpec spec;
  reference::KvCacheImage image;
  DeviceBuffer<unsigned char> k, v;
  DeviceBuffer<int32_t> block_table, lengths, batch_index;
  DeviceBuffer<float> k_scale, v_scale;  // FP8 caches
  KvCache view;

  size_t pool_elements(int which = 0) const {
    return size_t(image.num_pages) * image.kv_heads * image.page_size * size_t(spec.dim(which));
  }
  // K's (which 0) or V's (1) device buffer: K's for a V that is a view of K.
  const DeviceBuffer<unsigned char>& buffer(int which) const { return which == 0 || spec.v_in_k ? k : v; }
  // Device element index of (page, head, row, e) in K's (which 0) or V's (which 1) pool layout.
  size_t device_index(int which, int page, int head, int row, int e) const {
    return size_t((which == 0 ? view.k : view.v).offset(page, head, row, e));
  }
};

inline TestCache make_cache(Context& ctx, const CacheSpec& spec, std::mt19937_64& rng) {
  TestCache c;
  c.spec = spec;
  reference::KvCacheImage& im = c.image;
  im.batch = spec.batch;
  im.kv_heads = spec.kv_heads;
  im.head_dim = spec.head_dim;
  im.head_dim_v = spec.head_dim_v;
  im.page_size = spec.page_size;
  im.max_pages_per_seq = spec.paged ? spec.max_pages_per_seq : 1;
  im.num_pages = spec.paged ? spec.batch * spec.max_pages_per_seq + spec.extra_pages
                             : (spec.batch_index.empty() ? spec.batch : spec.cache_rows);
  im.lengths = spec.lengths;
  im.batch_index = spec.batch_index;
  if (spec.paged) {
    // Pages in shuffled order; with a shared prefix, every sequence's page 0 is sequence 0's.
    std::vector<int32_t> pages(size_t(im.num_pages));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    im.block_table.assign(size_t(spec.batch) * im.max_pages_per_seq, 0);
    for (size_t i = 0; i < im.block_table.size(); ++i) im.block_table[i] = pages[i];
    if (spec.shared_first_page)
      for (int b = 1; b < spec.batch; ++b) im.block_table[size_t(b) * im.max_pages_per_seq] = im.block_table[0];
  }
  const DType dtype = spec.dtype;
  const int64_t pool_batch = im.num_pages, seq = im.page_size;
  auto make_view = [&](int which, void* data) {
    if (which == 1 && spec.v_in_k) {  // K's view with its leading head_dim_v columns
      TensorView v = spec.k_layout.view(data, dtype, pool_batch, im.kv_heads, seq, im.head_dim);
      v.shape[3] = spec.v_dim();
      return v;
    }
    return (which == 0 ? spec.k_layout : spec.v_layout).view(data, dtype, pool_batch, im.kv_heads, seq, spec.dim(which));
  };
  // Which pool rows hold tokens.
  std::vector<char> live(size_t(im.num_pages) * im.page_size, 0);
  for (int b = 0; b < spec.batch; ++b)
    for (int t = spec.key_start.empty() ? 0 : std::max(spec.key_start[size_t(b)], 0); t < im.length(b); ++t) {
      const int page = im.page_of(b, t);
      if (page >= 0) live[size_t(page) * im.page_size + size_t(t % im.page_size)] = 1;
    }
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (int which = 0; which < 2; ++which) {
    const int d = spec.dim(which);
    std::vector<double>& image = which == 0 ? im.k : im.v;
    image.assign(c.pool_elements(which), std::numeric_limits<double>::quiet_NaN());
    if (which == 1 && spec.v_in_k) {  // V's image: K's leading columns (K's scale, the same values)
      for (size_t row = 0; row < image.size() / size_t(std::max(d, 1)); ++row)
        std::copy_n(im.k.begin() + ptrdiff_t(row * size_t(im.head_dim)), d, image.begin() + ptrdiff_t(row * size_t(d)));
      break;
    }
    const TensorView layout = make_view(which, nullptr);
    const Layout& pool = which == 0 ? spec.k_layout : spec.v_layout;
    // Row padding and unused rows hold NaN (0xff bytes).
    std::vector<unsigned char> host(
        std::max<size_t>(pool.elements(pool_batch, im.kv_heads, seq, d), 1) * dtype_size(dtype), 0xff);
    for (int page = 0; page < im.num_pages; ++page)
      for (int h = 0; h < im.kv_heads; ++h)
        for (int row = 0; row < im.page_size; ++row) {
          if (spec.poison_unused && !live[size_t(page) * im.page_size + size_t(row)]) continue;
          for (int e = 0; e < d; ++e) {
            // FP8: the code of the drawn value over the scale, imaged as code x scale.
            const double scale = spec.scale(which, h);
            const float value = round_to(dtype, float(uniform(rng) / scale));
            image[((size_t(page) * im.kv_heads + h) * im.page_size + size_t(row)) * d + size_t(e)] = value * scale;
            store_element(host.data(), dtype, size_t(layout.offset(page, h, row, e)), value);
          }
        }
    DeviceBuffer<unsigned char>& device = which == 0 ? c.k : c.v;
    device = DeviceBuffer<unsigned char>(ctx, host.size(), which == 0 ? "cache k" : "cache v");
    device.copy_from_host(host);
  }
  if (!spec.k_scale.empty()) {
    c.k_scale = DeviceBuffer<float>(ctx, spec.k_scale.size(), "cache k_scale");
    c.v_scale = DeviceBuffer<float>(ctx, spec.v_scale.size(), "cache v_scale");
    c.k_scale.copy_from_host(spec.k_scale);
    c.v_scale.copy_from_host(spec.v_scale);
  }
  c.lengths = DeviceBuffer<int32_t>(ctx, std::max<size_t>(im.lengths.size(), 1), "cache lengths");
  if (!im.lengths.empty()) c.lengths.copy_from_host(im.lengths);
  if (spec.paged) {
    c.block_table = DeviceBuffer<int32_t>(ctx, im.block_table.size(), "block table");
    c.block_table.copy_from_host(im.block_table);
    c.view = KvCache::paged_pool(make_view(0, c.k.data()), make_view(1, c.buffer(1).data()), c.block_table.data(),
                                 spec.batch, im.max_pages_per_seq, c.lengths.data());
  } else {
    c.view = KvCache::contiguous(make_view(0, c.k.data()), make_view(1, c.buffer(1).data()), c.lengths.data());
    if (!spec.batch_index.empty()) {
      c.batch_index = DeviceBuffer<int32_t>(ctx, spec.batch_index.size(), "cache batch_index");
      c.batch_index.copy_from_host(spec.batch_index);
      c.view.batch_index = c.batch_index.data();
      c.view.batch = spec.batch;
    }
  }
  if (!spec.k_scale.empty()) {
    c.view.k_scale = c.k_scale.data();
    c.view.v_scale = spec.v_in_k ? c.k_scale.data() : c.v_scale.data();
    c.view.scale_count = int(spec.k_scale.size());
  }
  return c;
}

// The device pool of K (which 0) or V (1) read back into the image's layout (as the reference sees it).
inline std::vector<double> download_pool(const TestCache& c, int which) {
  const std::vector<unsigned char> bytes = c.buffer(which).to_host();
  const reference::KvCacheImage& im = c.image;
  const int d = c.spec.dim(which);
  std::vector<double> image(c.pool_elements(which));
  for (int page = 0; page < im.num_pages; ++page)
    for (int h = 0; h < im.kv_heads; ++h)
      for (int row = 0; row < im.page_size; ++row)
        for (int e = 0; e < d; ++e)
          image[((size_t(page) * im.kv_heads + h) * im.page_size + size_t(row)) * d + size_t(e)] =
              load_element(bytes.data(), c.spec.dtype, c.device_index(which, page, h, row, e)) * c.spec.scale(which, h);
  return image;
}

// ---- rotary tables -----------------------------------------------------------------------------

struct TestRotary {
  reference::RotaryTable table;
  DeviceBuffer<unsigned char> cos, sin;
  Rotary view;
};

// Tables of `table_dtype` (f16/bf16 tables as models keep them), the reference's the same values.
inline TestRotary make_rotary(Context& ctx, int max_position, int rotary_dim, bool interleaved, std::mt19937_64& rng,
                              DType table_dtype = DType::f32) {
  TestRotary r;
  r.table.max_position = max_position;
  r.table.rotary_dim = rotary_dim;
  r.table.interleaved = interleaved;
  const size_t count = size_t(max_position) * (rotary_dim / 2);
  std::vector<float> cos(count), sin(count);
  std::uniform_real_distribution<float> angle(-3.14159f, 3.14159f);
  for (size_t i = 0; i < count; ++i) {
    const float a = angle(rng);
    cos[i] = round_to(table_dtype, std::cos(a));
    sin[i] = round_to(table_dtype, std::sin(a));
  }
  r.table.cos.assign(cos.begin(), cos.end());
  r.table.sin.assign(sin.begin(), sin.end());
  const size_t element = dtype_size(table_dtype);
  std::vector<unsigned char> cos_bytes(count * element), sin_bytes(count * element);
  for (size_t i = 0; i < count; ++i) {
    store_element(cos_bytes.data(), table_dtype, i, cos[i]);
    store_element(sin_bytes.data(), table_dtype, i, sin[i]);
  }
  r.cos = DeviceBuffer<unsigned char>(ctx, std::max<size_t>(cos_bytes.size(), 1), "rotary cos");
  r.sin = DeviceBuffer<unsigned char>(ctx, std::max<size_t>(sin_bytes.size(), 1), "rotary sin");
  r.cos.copy_from_host(cos_bytes);
  r.sin.copy_from_host(sin_bytes);
  r.view = Rotary{r.cos.data(), r.sin.data(), max_position, rotary_dim, interleaved};
  r.view.table_dtype = table_dtype;
  return r;
}

// Rows of rotary tables that end exactly at the last position a call rotates, so that position
// reads the table's last row (rotary.cuh clamps only positions past it: a clamp one row early
// shows only there): every sequence's tokens [0, min(length + extra, capacity)).
inline int rotary_rows_for(const reference::KvCacheImage& cache, int extra) {
  int rows = 1;
  for (int b = 0; b < cache.batch; ++b) rows = std::max(rows, std::min(cache.length(b) + extra, cache.capacity()));
  return rows;
}

// ---- one attention call against the reference ------------------------------------------------

struct AttendCase {
  CacheSpec cache;
  int heads = 1, seq_q = 1;
  Causal causal = Causal::bottom_right;
  bool with_lse = true;
  std::optional<std::pair<int, bool>> rotary;  // (rotary_dim, interleaved)
  int rotary_first_dim = 0;                    // Rotary::first_dim
  int num_splits = 0;                          // fused path: 0 automatic
  Layout q_layout = kQueryLayout, out_layout = kOutLayout;
  // Window, softcap, ALiBi, bias; the bias is [batch, heads, seq_q, capacity].
  testing::ScoreModsCase mods;
  std::vector<int32_t> q_offset;  // empty, or [batch] (KvAttentionOptions::q_offset)
  // q's and out's dtype when it is not the cache's (an FP8 cache's f32/f16/bf16 queries).
  std::optional<DType> query_dtype;

  DType q_dtype() const { return query_dtype ? *query_dtype : cache.dtype; }

  std::string name() const {
    std::string s = (query_dtype ? std::string("q ") + to_string(*query_dtype) + " " : std::string()) + cache.name() +
                    " h" + std::to_string(heads) + " q" + std::to_string(seq_q) + " " + to_string(causal);
    if (rotary) s += " rotary" + std::to_string(rotary->first) + (rotary->second ? "i" : "h");
    if (rotary_first_dim) s += "@" + std::to_string(rotary_first_dim);
    if (num_splits) s += " splits" + std::to_string(num_splits);
    for (const auto& [label, values] :
         {std::pair<const char*, const std::vector<int32_t>&>{" key_start", cache.key_start},
          {" q_offset", q_offset}}) {
      if (values.empty()) continue;
      s += label;
      for (size_t i = 0; i < values.size(); ++i) s += (i ? "," : "=") + std::to_string(values[i]);
    }
    s += " q " + q_layout.name() + " out " + out_layout.name();
    return s + mods.name();
  }
};

inline AttendCase attend(CacheSpec cache, int heads, int seq_q, Causal causal = Causal::bottom_right, bool with_lse = true) {
  AttendCase c;
  c.cache = std::move(cache);
  c.heads = heads;
  c.seq_q = seq_q;
  c.causal = causal;
  c.with_lse = with_lse;
  return c;
}

inline reference::Problem problem_of(const AttendCase& c) {
  reference::Problem p;
  p.batch = c.cache.batch;
  p.heads = c.heads;
  p.kv_heads = c.cache.kv_heads;
  p.seq_q = c.seq_q;
  p.head_dim = c.cache.head_dim;
  p.causal = c.causal;
  return p;
}

// A case's key_start and q_offset (empty: none) on the device, set in the call's options and the
// reference's problem; the buffers live as long as the returned value.
struct SequenceOffsets {
  DeviceBuffer<int32_t> key_start, q_offset;
};
inline SequenceOffsets upload_sequence_offsets(Context& ctx, const std::vector<int32_t>& key_start,
                                               const std::vector<int32_t>& q_offset, KvAttentionOptions& options,
                                               reference::Problem& problem) {
  SequenceOffsets device{DeviceBuffer<int32_t>(ctx, std::max<size_t>(key_start.size(), 1), "test key_start"),
                         DeviceBuffer<int32_t>(ctx, std::max<size_t>(q_offset.size(), 1), "test q_offset")};
  if (!key_start.empty()) {
    device.key_start.copy_from_host(key_start);
    options.key_start = device.key_start.data();
    problem.key_start = key_start;
  }
  if (!q_offset.empty()) {
    device.q_offset.copy_from_host(q_offset);
    options.q_offset = device.q_offset.data();
    problem.q_offset = q_offset;
  }
  return device;
}

// Runs attention_with_kv_cache on `cache` and compares out and lse with the reference.
inline ::testing::AssertionResult attend_and_check(Context& ctx, const AttendCase& c, const TestCache& cache, Path path,
                                            std::mt19937_64& rng, const TestRotary* rotary = nullptr) {
  const DType dtype = c.q_dtype();
  const int batch = c.cache.batch, d = c.cache.head_dim;
  Tensor q = random_tensor(ctx, dtype, batch, c.heads, c.seq_q, d, rng, c.q_layout);
  const size_t rows = size_t(batch) * c.heads * c.seq_q;
  const Output out = poisoned_output(ctx, dtype, batch, c.heads, c.seq_q, c.cache.v_dim(), c.out_layout);
  DeviceBuffer<unsigned char> lse = poisoned(ctx, DType::f32, rows);
  KvAttentionOptions options;
  options.path = path;
  options.causal = c.causal;
  options.num_splits = c.num_splits;
  if (c.with_lse) options.lse = reinterpret_cast<float*>(lse.data());
  if (rotary) options.rotary = rotary->view;
  reference::Problem problem = problem_of(c);
  problem.seq_k = int(cache.image.capacity());  // the key extent of the bias
  const SequenceOffsets offsets = upload_sequence_offsets(ctx, c.cache.key_start, c.q_offset, options, problem);
  testing::ScoreModsData mods;
  if (c.mods.any()) {
    mods = testing::make_score_mods(ctx, c.mods, dtype, batch, c.heads, c.seq_q, problem.seq_k, rng);
    mods.apply(c.mods, options);
    mods.apply(c.mods, problem);
  }
  attention_with_kv_cache(ctx, q.view, cache.view, out.view, options);
  ctx.synchronize();
  const testing::AttentionExpected expected =
      expected_kv_attention(problem, q.values, cache.image, dtype, rotary ? &rotary->table : nullptr);
  const std::string what = c.name() + " " + to_string(path);
  std::vector<float> out_values;
  ::testing::AssertionResult result = download_output(what + " out", out.device, out.view, out_values);
  if (result) result = judge_values(what + " out", out_values, expected.out);
  if (!result || !c.with_lse) return result;
  return judge_values(what + " lse", download(lse, DType::f32, rows), expected.lse);
}

inline ::testing::AssertionResult check_attend(Context& ctx, const AttendCase& c, Path path) {
  std::mt19937_64 rng = rng_for(c.name() + to_string(path));
  const TestCache cache = make_cache(ctx, c.cache, rng);
  std::optional<TestRotary> rotary;
  if (c.rotary) {
    rotary = make_rotary(ctx, rotary_rows_for(cache.image, 0), c.rotary->first, c.rotary->second, rng);
    rotary->view.first_dim = rotary->table.first_dim = c.rotary_first_dim;
  }
  return attend_and_check(ctx, c, cache, path, rng, rotary ? &*rotary : nullptr);
}

inline CacheSpec paged(DType dtype, int batch, int kv_heads, int head_dim, int page_size, int max_pages,
                std::vector<int32_t> lengths, bool head_major = true) {
  CacheSpec s;
  s.dtype = dtype;
  s.batch = batch;
  s.kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.page_size = page_size;
  s.max_pages_per_seq = max_pages;
  s.lengths = std::move(lengths);
  // K in the order asked, V in the other (each its own pad): every call reads two pool layouts.
  s.k_layout.head_major = head_major;
  s.v_layout.head_major = !head_major;
  return s;
}

inline CacheSpec contiguous(DType dtype, int batch, int kv_heads, int head_dim, int capacity, std::vector<int32_t> lengths,
                     bool head_major) {
  CacheSpec s = paged(dtype, batch, kv_heads, head_dim, capacity, 1, std::move(lengths), head_major);
  s.paged = false;
  return s;
}

}  // namespace selfattn::kv_test
