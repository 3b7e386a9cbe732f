// The KV-cache calls (kv_cache.h) given what they must refuse or survive, on the sim: every bad
// argument (a clear InvalidArgument naming it, out and the cache untouched), cu_seqlens_from_lengths,
// and wrong device metadata (clamped, never followed; or named by validate_metadata).
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kv_cache_check.h"
#include "selfattn/selfattn.h"

namespace selfattn {
namespace {

using namespace kv_test;

const Path kPaths[] = {Path::naive, Path::cublas, Path::fused};

// ---- bad arguments: a clear InvalidArgument naming the argument, out and the cache untouched ----

struct Call {
  TensorView q, out, k_new, v_new;
  KvCache cache;
  KvAttentionOptions attend;
  AppendKvOptions append;
};

// Two bytes past `data`: off the alignment of any 4-byte element.
template <class T>
T* misaligned(T* data) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(data) + 2);
}

struct BadArgumentFixture {
  Context ctx;
  std::mt19937_64 rng{5};
  TestCache cache = make_cache(ctx, paged(DType::f16, 2, 2, 64, 16, 3, {5, 20}), rng);
  Tensor q = random_tensor(ctx, DType::f16, 2, 4, 3, 64, rng, kQueryLayout);
  Tensor k_new = random_tensor(ctx, DType::f16, 2, 2, 3, 64, rng, kNewKeysLayout);
  Tensor v_new = random_tensor(ctx, DType::f16, 2, 2, 3, 64, rng, kNewValuesLayout);
  Output out = poisoned_output(ctx, DType::f16, 2, 4, 3, 64, kOutLayout);
  DeviceBuffer<float> lse{ctx, 2 * 4 * 3, "lse"};
  DeviceBuffer<int32_t> updated{ctx, 2, "updated lengths"};
  DeviceBuffer<int32_t> bad_lengths{ctx, 2, "bad lengths"}, bad_table{ctx, 6, "bad table"};
  DeviceBuffer<int32_t> edge_lengths{ctx, 2, "lengths at page edges"};
  TestRotary rotary = make_rotary(ctx, 64, 64, true, rng);
  DeviceBuffer<float> slopes{ctx, 8, "slopes"}, bias{ctx, 2 * 4 * 3 * 48, "bias"};

  Call valid() {
    Call call;
    call.q = q.view;
    call.out = out.view;
    call.k_new = k_new.view;
    call.v_new = v_new.view;
    call.cache = cache.view;
    call.attend.lse = lse.data();
    call.append.updated_lengths = updated.data();
    return call;
  }

  // Runs `run` on a mutated valid call: it must throw InvalidArgument mentioning `expected`, and
  // out, lse, updated_lengths and both pools must be byte-for-byte what they were.
  void expect_rejected(const std::string& expected, const std::function<void(Call&)>& mutate,
                       const std::function<void(Context&, const Call&)>& run) {
    Call call = valid();
    mutate(call);
    lse.fill_bytes(0xFF);
    updated.fill_bytes(0xFF);
    const std::vector<unsigned char> out_before = out.device.to_host(), k_before = cache.k.to_host(), v_before = cache.v.to_host();
    try {
      run(ctx, call);
      ctx.synchronize();
      ADD_FAILURE() << "no exception; expected InvalidArgument naming " << expected;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << "message: " << e.what();
    }
    EXPECT_TRUE(out.device.to_host() == out_before) << expected << ": out was written";
    EXPECT_TRUE(cache.k.to_host() == k_before) << expected << ": cache k was written";
    EXPECT_TRUE(cache.v.to_host() == v_before) << expected << ": cache v was written";
    const auto all_poison = [](const auto& values) {
      std::vector<unsigned char> bytes(values.size() * sizeof(values[0]));
      std::memcpy(bytes.data(), values.data(), bytes.size());
      return std::all_of(bytes.begin(), bytes.end(), [](unsigned char byte) { return byte == 0xFF; });
    };
    EXPECT_TRUE(all_poison(lse.to_host())) << expected << ": lse was written";
    EXPECT_TRUE(all_poison(updated.to_host())) << expected << ": updated_lengths was written";
  }
};

void run_attend(Context& ctx, const Call& call) { attention_with_kv_cache(ctx, call.q, call.cache, call.out, call.attend); }
void run_append(Context& ctx, const Call& call) { append_kv(ctx, call.cache, call.k_new, call.v_new, call.append); }

TEST(KvCacheArguments, AttentionRejectsEachBadArgument) {
  BadArgumentFixture f;
  f.bad_lengths.copy_from_host(std::vector<int32_t>{5, 49});
  f.bad_table.copy_from_host(std::vector<int32_t>{0, 1, 2, 8, 3, 4});
  const std::vector<std::pair<std::string, std::function<void(Call&)>>> cases = {
      {"q.dtype", [](Call& c) { c.q.dtype = DType::bf16; }},
      {"out.dtype", [](Call& c) { c.out.dtype = DType::f32; }},
      {"q.shape[0]", [](Call& c) { c.q.shape[0] = 3; }},
      {"q.shape[1] (heads)", [](Call& c) { c.q.shape[1] = 3; c.out.shape[1] = 3; }},
      {"q.shape[3]", [](Call& c) { c.q.shape[3] = 32; }},
      {"out.shape[2]", [](Call& c) { c.out.shape[2] = 2; }},
      {"out.shape[3] (head_dim) expected 64 (cache.v.shape[3])", [](Call& c) { c.out.shape[3] = 32; }},
      {"q.strides[3]", [](Call& c) { c.q.strides[3] = 2; }},
      {"out expected not to overlap q", [](Call& c) { c.out.data = c.q.data; }},
      {"cache.lengths expected non-null", [](Call& c) { c.cache.lengths = nullptr; }},
      {"cache.max_pages_per_seq", [](Call& c) { c.cache.max_pages_per_seq = 0; }},
      {"cache.batch", [](Call& c) { c.cache.batch = -1; }},
      {"cache.v.shape[0]", [](Call& c) { c.cache.v.shape[0] -= 1; }},
      {"cache.v.dtype", [](Call& c) { c.cache.v.dtype = DType::f32; }},
      {"cache.k.shape[2] (page_size)", [](Call& c) { c.cache.k.shape[2] = c.cache.v.shape[2] = 0; }},
      {"cache.v expected not to overlap cache.k", [](Call& c) { c.cache.v.data = c.cache.k.data; }},
      // K's strides but starting two columns in: overlapping K, yet not its leading columns.
      {"cache.v expected not to overlap cache.k, or to be a view of its leading columns (cache.k's data and strides, "
       "shape[3] <= cache.k.shape[3] = 64), got a view that overlaps it otherwise",
       [](Call& c) {
         c.cache.v = c.cache.k;
         c.cache.v.data = static_cast<char*>(c.cache.k.data) + 2 * sizeof(uint16_t);
         c.cache.v.shape[3] = c.out.shape[3] = 32;
       }},
      {"cache.v expected not to overlap cache.k", [](Call& c) {
         c.cache.v = c.cache.k;
         c.cache.v.shape[3] = c.out.shape[3] = 66;  // more columns than K's rows
       }},
      {"options.causal", [](Call& c) { c.attend.causal = Causal::top_left; }},
      {"options.scale", [](Call& c) { c.attend.scale = std::numeric_limits<float>::infinity(); }},
      {"options.num_splits", [](Call& c) { c.attend.num_splits = -1; }},
      {"options.lse expected not to overlap out", [](Call& c) { c.attend.lse = static_cast<float*>(c.out.data); }},
      {"options.rotary.rotary_dim", [&](Call& c) { c.attend.rotary = f.rotary.view; c.attend.rotary->rotary_dim = 7; }},
      {"options.rotary.cos", [&](Call& c) { c.attend.rotary = f.rotary.view; c.attend.rotary->cos = nullptr; }},
      {"options.rotary.max_position", [&](Call& c) { c.attend.rotary = f.rotary.view; c.attend.rotary->max_position = 0; }},
      {"options.rotary.first_dim expected 0 to head_dim = 64, got -1",
       [&](Call& c) { c.attend.rotary = f.rotary.view; c.attend.rotary->first_dim = -1; }},
      {"options.rotary.rotary_dim expected an even number in [2, head_dim - first_dim = 56], got 64",
       [&](Call& c) { c.attend.rotary = f.rotary.view; c.attend.rotary->first_dim = 8; }},
      {"cache.lengths[1] expected <= 48",
       [&](Call& c) { c.cache.lengths = f.bad_lengths.data(); c.attend.validate_metadata = true; }},
      {"cache.block_table[1][0] expected a page in [0, 8)",
       [&](Call& c) { c.cache.block_table = f.bad_table.data(); c.attend.validate_metadata = true; }},
      {"cache.batch expected 8 (cache.k.shape[0], a contiguous cache)", [](Call& c) { c.cache.block_table = nullptr; }},
      {"cache.batch_index expected null with a block table",
       [&](Call& c) { c.cache.batch_index = f.bad_lengths.data(); }},
      {"options.key_start expected not to overlap out",
       [](Call& c) { c.attend.key_start = static_cast<const int32_t*>(c.out.data); }},
      {"options.q_offset expected 4-byte alignment",
       [&](Call& c) { c.attend.q_offset = misaligned(f.bad_lengths.data()); }},
      // Masks and score modifiers: the rule of attention() (attention_validation.cpp), the bias's
      // key extent the capacity (48).
      {"options.window_left expected -1 (unbounded) or >= 0, got -2", [](Call& c) { c.attend.window_left = -2; }},
      {"options.window_right", [](Call& c) { c.attend.window_right = -5; }},
      {"options.softcap expected a finite number > 0", [](Call& c) { c.attend.softcap = 0.0f; }},
      {"options.softcap", [](Call& c) { c.attend.softcap = std::numeric_limits<float>::infinity(); }},
      {"options.alibi_slopes_count expected heads = 4",
       [&](Call& c) { c.attend.alibi_slopes = f.slopes.data(); c.attend.alibi_slopes_count = 3; }},
      {"options.alibi_slopes expected non-null", [](Call& c) { c.attend.alibi_slopes_count = 4; }},
      {"options.bias.shape[3] (capacity) expected 48 or 1 (broadcast), got 47",
       [&](Call& c) { c.attend.bias = TensorView::bhsd(f.bias.data(), DType::f32, 2, 4, 3, 47); }},
      {"options.bias.shape[2] (seq_q) expected 3",
       [&](Call& c) { c.attend.bias = TensorView::bhsd(f.bias.data(), DType::f32, 2, 4, 2, 48); }},
      {"options.bias.dtype expected f32, b8 (a boolean mask) or q.dtype",
       [&](Call& c) { c.attend.bias = TensorView::bhsd(f.bias.data(), DType::bf16, 2, 4, 3, 48); }},
      {"options.bias expected not to overlap out",
       [](Call& c) { c.attend.bias = TensorView::bhsd(c.out.data, DType::f16, 1, 1, 3, 48); }},
      {"options.alibi_slopes expected not to overlap options.lse",
       [](Call& c) { c.attend.alibi_slopes = c.attend.lse; c.attend.alibi_slopes_count = 4; }},
      {"options.sinks expected not to overlap out", [](Call& c) { c.attend.sinks = static_cast<float*>(c.out.data); }},
      // 2 query heads per kv head x 2^30 rows: past the decode kernels' int32 row numbers (q read
      // through stride 0, out's rows far apart: only the count is too large).
      {"q.shape[1] / kv_heads * q.shape[2] (query rows per kv head) expected <= 2147483583, got 2147483648",
       [](Call& c) {
         c.q.shape[2] = c.out.shape[2] = int64_t(1) << 30;
         c.q.strides[2] = 0;
         c.attend.lse = nullptr;
       }},
      // A capacity past 2^31 - 2^16 (16-row pages): the decode kernels' key loops would wrap.
      {"cache capacity (page_size * max_pages_per_seq) expected <= 2147418112, got 2147483648",
       [](Call& c) { c.cache.max_pages_per_seq = 1 << 27; }},
      // Pointers off their element size (they fault on the GPU) and an out whose rows share addresses.
      {"q.data expected alignment to its element size 2", [](Call& c) { c.q.data = static_cast<char*>(c.q.data) + 1; }},
      {"cache.lengths expected 4-byte alignment", [](Call& c) { c.cache.lengths = misaligned(c.cache.lengths); }},
      {"cache.block_table expected 4-byte alignment", [](Call& c) { c.cache.block_table = misaligned(c.cache.block_table); }},
      {"options.lse expected 4-byte alignment", [](Call& c) { c.attend.lse = misaligned(c.attend.lse); }},
      {"options.rotary.sin expected 4-byte alignment",
       [&](Call& c) { c.attend.rotary = f.rotary.view; c.attend.rotary->sin = misaligned(c.attend.rotary->sin); }},
      {"out.strides[2] (seq) = 0 makes elements of out share addresses", [](Call& c) { c.out.strides[2] = 0; }},
      {"attention_with_kv_cache: q.shape[3] (head_dim) expected >= 1 when there are query rows",
       [](Call& c) { c.q.shape[3] = c.out.shape[3] = c.cache.k.shape[3] = c.cache.v.shape[3] = 0; }},
  };
  for (const auto& [expected, mutate] : cases) f.expect_rejected(expected, mutate, run_attend);
}

TEST(KvCacheArguments, AppendRejectsEachBadArgument) {
  BadArgumentFixture f;
  f.bad_lengths.copy_from_host(std::vector<int32_t>{46, 0});
  f.bad_table.copy_from_host(std::vector<int32_t>{0, 1, 2, -1, 3, 4});
  const std::vector<std::pair<std::string, std::function<void(Call&)>>> cases = {
      {"k_new.dtype", [](Call& c) { c.k_new.dtype = DType::bf16; }},
      {"k_new.shape[1] (kv_heads)", [](Call& c) { c.k_new.shape[1] = 1; }},
      {"k_new.shape[0] (batch)", [](Call& c) { c.k_new.shape[0] = 1; }},
      {"v_new.shape[2]", [](Call& c) { c.v_new.shape[2] = 2; }},
      {"k_new expected not to overlap cache.k", [](Call& c) { c.k_new.data = c.cache.k.data; }},
      {"options.updated_lengths expected not to overlap cache.lengths",
       [](Call& c) { c.append.updated_lengths = const_cast<int32_t*>(c.cache.lengths); }},
      {"options.rotary.rotary_dim", [&](Call& c) { c.append.rotary = f.rotary.view; c.append.rotary->rotary_dim = 66; }},
      {"options.rotary.rotary_dim expected an even number in [2, head_dim - first_dim = 2], got 64",
       [&](Call& c) { c.append.rotary = f.rotary.view; c.append.rotary->first_dim = 62; }},
      // A latent cache (V a view of K's leading columns) takes v_new as the same view of k_new.
      {"v_new expected a view of k_new's leading columns (k_new's data and strides), as cache.v is of cache.k",
       [](Call& c) {
         c.cache.v = c.cache.k;
         c.cache.v.shape[3] = c.v_new.shape[3] = 32;
       }},
      {"cache.lengths[0] expected <= 45 (capacity 48 - seq_new 3)",
       [&](Call& c) { c.cache.lengths = f.bad_lengths.data(); c.append.validate_metadata = true; }},
      {"cache.block_table[1][0] expected a page in [0, 8)",
       [&](Call& c) { c.cache.block_table = f.bad_table.data(); c.append.validate_metadata = true; }},
      {"cache.k.strides[1] (heads) = 0 makes elements of cache.k share addresses", [](Call& c) { c.cache.k.strides[1] = 0; }},
      // V has its own strides (and its own check): rows of V alone sharing addresses.
      {"cache.v.strides[2] (seq) = 0 makes elements of cache.v share addresses", [](Call& c) { c.cache.v.strides[2] = 0; }},
      {"options.updated_lengths expected not to overlap k_new",
       [](Call& c) { c.append.updated_lengths = static_cast<int32_t*>(c.k_new.data); }},
      {"options.updated_lengths expected 4-byte alignment",
       [&](Call& c) { c.append.updated_lengths = misaligned(f.bad_lengths.data()); }},
  };
  for (const auto& [expected, mutate] : cases) f.expect_rejected(expected, mutate, run_append);
}

// validate_metadata at the edges of the pages each sequence uses (the fixture's cache: 2 sequences,
// 16-row pages, 3 per sequence, 8 in the pool). A bad entry (outside the pool: -1 or 8) in any page
// a sequence uses - its first, its last partly filled one, for append_kv the pages only the new
// tokens reach - is refused, named, with nothing written; the same entry one page past the last
// used one is never read, and lengths that fill the capacity exactly pass.
TEST(KvCacheArguments, MetadataCheckedInEveryUsedPageAndNoFurther) {
  BadArgumentFixture f;
  const int page_size = f.cache.spec.page_size, max_pages = f.cache.spec.max_pages_per_seq;
  const int capacity = page_size * max_pages, num_pages = f.cache.image.num_pages;
  struct Edge {
    const char* call;
    std::vector<int32_t> lengths;  // each ends inside a page (the last one partly filled) or on its edge
    int new_tokens;
    std::function<void(Context&, const Call&)> run;
  };
  const std::vector<Edge> edges = {
      {"attention", {5, page_size + 4}, 0, run_attend},
      // 16 + 3 new: the second page holds new tokens only; 30 + 3: one new token in the third.
      {"append", {page_size, 2 * page_size - 2}, int(f.k_new.view.seq()), run_append},
  };
  for (const Edge& edge : edges) {
    f.edge_lengths.copy_from_host(edge.lengths);
    for (int b = 0; b < 2; ++b) {
      const int pages_used = (edge.lengths[size_t(b)] + edge.new_tokens + page_size - 1) / page_size;
      for (int page = 0; page <= pages_used && page < max_pages; ++page) {
        std::vector<int32_t> table = f.cache.image.block_table;
        table[size_t(b * max_pages + page)] = page % 2 == 0 ? -1 : num_pages;
        const auto use_table = [&](Call& c) {
          f.bad_table.copy_from_host(table);
          c.cache.block_table = f.bad_table.data();
          c.cache.lengths = f.edge_lengths.data();
          c.attend.validate_metadata = c.append.validate_metadata = true;
        };
        const std::string entry = "cache.block_table[" + std::to_string(b) + "][" + std::to_string(page) + "]";
        if (page < pages_used) {
          f.expect_rejected(entry + " expected a page in [0, " + std::to_string(num_pages) + ")", use_table, edge.run);
        } else {
          Call call = f.valid();
          use_table(call);
          EXPECT_NO_THROW(edge.run(f.ctx, call)) << edge.call << ": " << entry << " is past the pages used";
          f.ctx.synchronize();
        }
      }
    }
  }
  // Full to the last slot (with the new tokens), every table entry in use and valid: accepted.
  for (const Edge& edge : edges) {
    f.edge_lengths.copy_from_host(std::vector<int32_t>{capacity - edge.new_tokens, capacity - edge.new_tokens});
    Call call = f.valid();
    call.cache.lengths = f.edge_lengths.data();
    call.attend.validate_metadata = call.append.validate_metadata = true;
    EXPECT_NO_THROW(edge.run(f.ctx, call)) << edge.call << ": lengths filling the capacity";
    f.ctx.synchronize();
  }
}

// validate_metadata's messages name the entry and end with what the kernels would have done with
// it unchecked (kv_cache.h: device metadata is clamped), so a caller knows what turning the check
// off means; nothing is written.
TEST(KvCacheArguments, ValidateMetadataSaysWhatTheKernelsWouldDo) {
  BadArgumentFixture f;
  const std::string unchecked = " (validate_metadata; without it the kernels ";
  const auto with_lengths = [&](std::vector<int32_t> lengths) {
    return [&f, lengths](Call& c) {
      f.bad_lengths.copy_from_host(lengths);
      c.cache.lengths = f.bad_lengths.data();
      c.attend.validate_metadata = c.append.validate_metadata = true;
    };
  };
  f.expect_rejected("attention_with_kv_cache: cache.lengths[1] expected <= 48 (capacity 48), got 49" + unchecked +
                        "read it as the capacity)",
                    with_lengths({5, 49}), run_attend);
  f.expect_rejected("attention_with_kv_cache: cache.lengths[0] expected >= 0, got -2" + unchecked + "read it as 0)",
                    with_lengths({-2, 5}), run_attend);
  f.expect_rejected("append_kv: cache.lengths[0] expected <= 45 (capacity 48 - seq_new 3), got 46" + unchecked +
                        "drop the tokens past it)",
                    with_lengths({46, 5}), run_append);
  f.expect_rejected("append_kv: cache.lengths[1] expected <= 45 (capacity 48 - seq_new 3), got 50" + unchecked +
                        "read it as the capacity)",
                    with_lengths({5, 50}), run_append);
  const auto with_table = [&](Call& c) {
    f.bad_table.copy_from_host(std::vector<int32_t>{0, 1, 2, 8, 3, 4});
    c.cache.block_table = f.bad_table.data();
    c.attend.validate_metadata = c.append.validate_metadata = true;
  };
  for (const auto& run : {run_attend, run_append}) {
    f.expect_rejected("cache.block_table[1][0] expected a page in [0, 8) (cache.k.shape[0]), got 8" + unchecked +
                          "read it as zeros and write nothing to it)",
                      with_table, run);
  }
}

TEST(KvCacheArguments, MergeRejectsEachBadArgument) {
  Context ctx;
  std::mt19937_64 rng(9);
  Tensor a = random_tensor(ctx, DType::f16, 1, 2, 3, 8, rng, kMergeALayout);
  Tensor b = random_tensor(ctx, DType::f16, 1, 2, 3, 8, rng, kMergeBLayout);
  DeviceBuffer<float> lse_a(ctx, 6, "lse a"), lse_b(ctx, 6, "lse b"), lse_out(ctx, 6, "lse out");
  const Output merged = poisoned_output(ctx, DType::f16, 1, 2, 3, 8, kMergedLayout);
  const DeviceBuffer<unsigned char>& out = merged.device;
  const TensorView out_view = merged.view;
  auto expect = [&](const std::string& expected, TensorView out_a, const float* la, TensorView out_b, const float* lb,
                    TensorView o, float* lo) {
    lse_out.fill_bytes(0xFF);
    const std::vector<unsigned char> before = out.to_host(), b_before = b.device.to_host();
    try {
      merge_states(ctx, out_a, la, out_b, lb, o, lo);
      ADD_FAILURE() << "no exception; expected InvalidArgument naming " << expected;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << "message: " << e.what();
    }
    EXPECT_TRUE(out.to_host() == before) << expected << ": out was written";
    EXPECT_TRUE(b.device.to_host() == b_before) << expected << ": out_b was written";
    const std::vector<float> lse_after = lse_out.to_host();
    EXPECT_TRUE(std::all_of(lse_after.begin(), lse_after.end(), [](float x) { return std::isnan(x); }))
        << expected << ": lse_out was written";
  };
  TensorView wrong_shape = b.view;
  wrong_shape.shape[3] = 4;
  TensorView wrong_dtype = out_view;
  wrong_dtype.dtype = DType::bf16;
  expect("out_b.shape[3]", a.view, lse_a.data(), wrong_shape, lse_b.data(), out_view, lse_out.data());
  expect("out.dtype", a.view, lse_a.data(), b.view, lse_b.data(), wrong_dtype, lse_out.data());
  expect("lse_a expected non-null", a.view, nullptr, b.view, lse_b.data(), out_view, lse_out.data());
  expect("out expected not to overlap out_b", a.view, lse_a.data(), b.view, lse_b.data(), b.view, lse_out.data());
  expect("lse_out expected not to overlap lse_b", a.view, lse_a.data(), b.view, lse_b.data(), out_view, lse_b.data());
  TensorView shared_rows = out_view;
  shared_rows.strides[2] = 0;
  expect("out.strides[2] (seq) = 0 makes elements", a.view, lse_a.data(), b.view, lse_b.data(), shared_rows, lse_out.data());
  expect("lse_out expected 4-byte alignment", a.view, lse_a.data(), b.view, lse_b.data(), out_view, misaligned(lse_out.data()));
}

// cu_seqlens from device lengths on the device (batch 0 gives the single 0), and its bad arguments.
TEST(KvCacheDeviceHelpers, CuSeqlensFromLengths) {
  Context ctx;
  DeviceBuffer<int32_t> lengths(ctx, 5, "lengths"), cu(ctx, 6, "cu_seqlens");
  lengths.copy_from_host(std::vector<int32_t>{3, 0, 7, 1, 1000});
  cu.fill_bytes(0xff);
  cu_seqlens_from_lengths(ctx, lengths.data(), 5, cu.data());
  EXPECT_EQ(cu.to_host(), (std::vector<int32_t>{0, 3, 3, 10, 11, 1011}));
  cu.fill_bytes(0xff);
  cu_seqlens_from_lengths(ctx, lengths.data(), 0, cu.data());
  EXPECT_EQ(cu.to_host()[0], 0);
  EXPECT_EQ(cu.to_host()[1], -1);  // only batch + 1 entries are written
  const std::vector<int32_t> before = cu.to_host();
  auto expect_rejected = [&](const std::string& expected, const int32_t* in, int batch, int32_t* out) {
    try {
      cu_seqlens_from_lengths(ctx, in, batch, out);
      ADD_FAILURE() << "no exception; expected InvalidArgument naming " << expected;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << "message: " << e.what();
    }
    EXPECT_EQ(cu.to_host(), before) << expected;
  };
  expect_rejected("batch expected >= 0", lengths.data(), -1, cu.data());
  expect_rejected("lengths expected non-null", nullptr, 2, cu.data());
  expect_rejected("cu_seqlens expected non-null", lengths.data(), 2, nullptr);
  expect_rejected("cu_seqlens expected not to overlap lengths", cu.data() + 1, 3, cu.data());
}

// Wrong device metadata without validate_metadata: lengths past the capacity or negative, block
// table entries outside the pool. The kernels clamp: nothing outside the buffers is touched (the
// sim's guard zones would fail the launch), and every output is finite.
TEST(KvCacheMetadata, WrongEntriesAreClampedNotFollowed) {
  Context ctx;
  std::mt19937_64 rng(3);
  CacheSpec spec = paged(DType::f16, 3, 2, 64, 16, 2, {5, 9, 20});
  spec.poison_unused = false;  // wrong lengths reach rows no sequence owns: they must be finite here
  TestCache cache = make_cache(ctx, spec, rng);
  cache.lengths.copy_from_host(std::vector<int32_t>{-7, 1 << 30, 20});
  cache.block_table.copy_from_host(std::vector<int32_t>{-1, 999, INT_MAX, 0, 1, INT_MIN});
  Tensor q = random_tensor(ctx, DType::f16, 3, 4, 3, 64, rng, kQueryLayout);
  Tensor k_new = random_tensor(ctx, DType::f16, 3, 2, 5, 64, rng, kNewKeysLayout);
  for (Path path : kPaths) {
    const Output out = poisoned_output(ctx, DType::f16, 3, 4, 3, 64, kOutLayout);
    KvAttentionOptions options;
    options.path = path;
    attention_with_kv_cache(ctx, q.view, cache.view, out.view, options);
    ctx.synchronize();
    std::vector<float> values;
    ASSERT_TRUE(download_output(to_string(path), out.device, out.view, values));
    for (float value : values) {
      ASSERT_TRUE(std::isfinite(value)) << to_string(path);
    }
  }
  AppendKvOptions options;
  append_kv(ctx, cache.view, k_new.view, k_new.view, options);
  ctx.synchronize();
}

}  // namespace
}  // namespace selfattn
