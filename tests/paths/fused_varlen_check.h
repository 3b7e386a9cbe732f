#pragma once
// Checks one variable-length call (attention_varlen: packed sequences, cu_seqlens, zero-length
// sequences) of the fused path: each sequence against the double-precision reference run on that
// sequence alone. The shared harness takes padded batches only. Used by test_fused_varlen (sim)
// and test_fused_gpu (cuda).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attention_harness.h"
#include "selfattn/selfattn.h"

namespace selfattn::fused_test {

using testing::load_element;
using testing::round_to;
using testing::store_element;

struct VarlenCase {
  DType dtype = DType::f16;
  int heads = 1, kv_heads = 1, head_dim = 64;
  std::vector<int> q_lens, k_lens;  // per sequence; 0 allowed
  Causal causal = Causal::none;
  bool with_lse = true;
  int misalign = 0;  // elements by which every tensor's data pointer is shifted (breaks 16-byte rows)

  std::string name() const {
    std::string s = std::string(to_string(dtype)) + " h" + std::to_string(heads) + "/" + std::to_string(kv_heads) +
                    " d" + std::to_string(head_dim) + " causal=" + to_string(causal) + " q=[";
    for (int n : q_lens) s += std::to_string(n) + ",";
    s += "] k=[";
    for (int n : k_lens) s += std::to_string(n) + ",";
    return s + "]" + (misalign ? " misaligned" : "");
  }
};

// Random values rounded to the dtype: logical [heads, total, d] doubles and the device bytes.
struct Packed {
  std::vector<double> logical;
  DeviceBuffer<unsigned char> device;
};

inline Packed make_packed(Context& ctx, DType dtype, int heads, int total, int head_dim, std::mt19937_64& rng,
                   int offset = 0) {
  Packed p;
  const size_t count = size_t(heads) * total * head_dim;
  std::vector<unsigned char> host((std::max<size_t>(count, 1) + offset) * dtype_size(dtype));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  p.logical.resize(count);
  for (size_t i = 0; i < count; ++i) {
    const float value = round_to(dtype, normal(rng));
    p.logical[i] = value;
    store_element(host.data(), dtype, i + offset, value);
  }
  p.device = DeviceBuffer<unsigned char>(ctx, host.size(), "varlen operand");
  p.device.copy_from_host(host);
  return p;
}

inline std::vector<int32_t> prefix_sums(const std::vector<int>& lens) {
  std::vector<int32_t> cu(1, 0);
  for (int n : lens) cu.push_back(cu.back() + n);
  return cu;
}

// Slice of sequence b of a packed [heads, total, d] tensor as a contiguous [1, heads, len, d].
inline std::vector<double> slice(const std::vector<double>& packed, int heads, int total, int d, int start, int len) {
  std::vector<double> out(size_t(heads) * len * d);
  for (int h = 0; h < heads; ++h)
    for (int s = 0; s < len; ++s)
      for (int e = 0; e < d; ++e)
        out[(size_t(h) * len + s) * d + e] = packed[(size_t(h) * total + start + s) * d + e];
  return out;
}

inline ::testing::AssertionResult check_varlen(Context& ctx, const VarlenCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int batch = int(c.q_lens.size());
  const std::vector<int32_t> cu_q = prefix_sums(c.q_lens), cu_k = prefix_sums(c.k_lens);
  const int total_q = cu_q.back(), total_k = cu_k.back();
  int max_q = 0, max_k = 0;
  for (int b = 0; b < batch; ++b) {
    max_q = std::max(max_q, c.q_lens[b]);
    max_k = std::max(max_k, c.k_lens[b]);
  }
  const int d = c.head_dim;
  Packed q = make_packed(ctx, c.dtype, c.heads, total_q, d, rng, c.misalign);
  Packed k = make_packed(ctx, c.dtype, c.kv_heads, total_k, d, rng, c.misalign);
  Packed v = make_packed(ctx, c.dtype, c.kv_heads, total_k, d, rng, c.misalign);
  DeviceBuffer<int32_t> cu_q_dev(ctx, cu_q.size(), "cu_seqlens_q"), cu_k_dev(ctx, cu_k.size(), "cu_seqlens_k");
  cu_q_dev.copy_from_host(cu_q);
  cu_k_dev.copy_from_host(cu_k);
  const size_t out_count = size_t(c.heads) * total_q * d;
  DeviceBuffer<unsigned char> out(ctx, (std::max<size_t>(out_count, 1) + c.misalign) * dtype_size(c.dtype),
                                  "varlen out");
  DeviceBuffer<float> lse(ctx, std::max<size_t>(size_t(c.heads) * total_q, 1), "varlen lse");
  out.fill_bytes(0xff);  // NaN in every dtype: an element nobody wrote fails
  lse.fill_bytes(0xff);

  AttentionOptions options;
  options.path = Path::fused;
  options.causal = c.causal;
  options.lse = c.with_lse ? lse.data() : nullptr;
  const auto view = [&](void* data, int heads, int total) {
    return TensorView::bhsd(static_cast<unsigned char*>(data) + c.misalign * dtype_size(c.dtype), c.dtype, 1, heads,
                            total, d);
  };
  attention_varlen(ctx, view(q.device.data(), c.heads, total_q), view(k.device.data(), c.kv_heads, total_k),
                   view(v.device.data(), c.kv_heads, total_k), view(out.data(), c.heads, total_q), cu_q_dev.data(),
                   cu_k_dev.data(), batch, max_q, max_k, options);
  ctx.synchronize();
  const std::vector<unsigned char> out_host = out.to_host();
  const std::vector<float> lse_host = lse.to_host();

  double err2 = 0, ref2 = 0, lse_err = 0;
  for (int b = 0; b < batch; ++b) {
    const int lq = c.q_lens[b], lk = c.k_lens[b];
    if (lq == 0) continue;
    reference::Problem problem;
    problem.heads = c.heads;
    problem.kv_heads = c.kv_heads;
    problem.seq_q = lq;
    problem.seq_k = lk;
    problem.head_dim = d;
    problem.causal = c.causal;
    const reference::Result ref =
        reference::attention(problem, slice(q.logical, c.heads, total_q, d, cu_q[b], lq),
                             slice(k.logical, c.kv_heads, total_k, d, cu_k[b], lk),
                             slice(v.logical, c.kv_heads, total_k, d, cu_k[b], lk));
    for (int h = 0; h < c.heads; ++h) {
      for (int s = 0; s < lq; ++s) {
        const size_t packed_row = size_t(h) * total_q + cu_q[b] + s;
        const size_t ref_row = size_t(h) * lq + s;
        for (int e = 0; e < d; ++e) {
          const double got = load_element(out_host.data(), c.dtype, packed_row * d + e + c.misalign);
          const double want = ref.out[ref_row * d + e];
          if (std::isnan(got)) {
            return ::testing::AssertionFailure() << c.name() << ": out NaN (unwritten?) at sequence " << b << " head "
                                                 << h << " row " << s << " col " << e;
          }
          err2 += (got - want) * (got - want);
          ref2 += want * want;
        }
        if (!c.with_lse) continue;
        const double got = lse_host[packed_row], want = ref.lse[ref_row];
        if (std::isinf(want) || std::isinf(got)) {
          if (!(std::isinf(want) && std::isinf(got) && want < 0 && got < 0)) {
            return ::testing::AssertionFailure() << c.name() << ": lse " << got << " expected " << want
                                                 << " at sequence " << b << " head " << h << " row " << s;
          }
          continue;
        }
        if (std::isnan(got)) return ::testing::AssertionFailure() << c.name() << ": lse NaN at sequence " << b;
        lse_err = std::max(lse_err, std::abs(got - want) / std::max(1.0, std::abs(want)));
      }
    }
  }
  const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  if (ref2 == 0 && err2 != 0) return ::testing::AssertionFailure() << c.name() << ": expected all zeros";
  if (rel > testing::tolerance(c.dtype)) {
    return ::testing::AssertionFailure() << c.name() << ": relative error " << rel << " > "
                                         << testing::tolerance(c.dtype);
  }
  if (lse_err > testing::lse_tolerance(c.dtype)) {
    return ::testing::AssertionFailure() << c.name() << ": lse error " << lse_err;
  }
  return ::testing::AssertionSuccess();
}

inline uint64_t seed_for(const VarlenCase& c) {
  const char* env = std::getenv("SELFATTN_SIM_SEED");
  return std::hash<std::string>{}(c.name()) ^ (env ? std::strtoull(env, nullptr, 10) * 0x9e3779b97f4a7c15ull : 0);
}

}  // namespace selfattn::fused_test
