// One case: the checked run, warm-up and the timed calls over the inputs (inputs.cpp), and the
// FLOPs and bytes a case moves.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "accuracy.h"
#include "bench.h"
#include "inputs.h"
#include "selfattn/reference.h"

namespace selfattn_bench {

CaseResult measure_case(selfattn::Context& ctx, const Case& c, const RunSettings& settings, InputCache& cache) {
  CaseResult result;
  result.c = c;
  result.resolved_path = name(c.path);
  if (c.path != Path::automatic && !selfattn::path_available(ctx, c.path)) {
    result.note = std::string("path ") + name(c.path) + " is not available in this build/backend";
    return result;
  }
  if (c.kv_heads <= 0 || c.heads % c.kv_heads != 0) {
    result.note = "kv_heads must divide heads";
    return result;
  }

  if (is_fp8(c.dtype) && c.direction != Direction::fwd) {
    result.note = "FP8 inputs have no backward (attention.h): forward only";
    return result;
  }

  InputCache::Inputs& in = cache.get(ctx, c);
  result.copies = int(in.sets.size());
  // q, k, dq, dk rows of head_dim; v, out, dout, dv rows of v_dim(c).
  auto view_of = [&](selfattn::DeviceBuffer<unsigned char>& buffer, int heads, int seq, DType dtype, int cols) {
    return c.layout == Layout::bhsd ? selfattn::TensorView::bhsd(buffer.data(), dtype, c.batch, heads, seq, cols)
                                    : selfattn::TensorView::bshd(buffer.data(), dtype, c.batch, heads, seq, cols);
  };
  auto view = [&](selfattn::DeviceBuffer<unsigned char>& buffer, int heads, int seq) {
    return view_of(buffer, heads, seq, c.dtype, c.head_dim);
  };
  auto v_view = [&](selfattn::DeviceBuffer<unsigned char>& buffer, int heads, int seq) {
    return view_of(buffer, heads, seq, c.dtype, v_dim(c));
  };
  selfattn::AttentionOptions options;
  if (is_fp8(c.dtype)) {
    const size_t per_tensor = size_t(c.batch) * c.kv_heads;
    options.q_descale = in.descales.data();
    options.k_descale = in.descales.data() + per_tensor;
    options.v_descale = in.descales.data() + 2 * per_tensor;
  }
  options.path = c.path;
  options.causal = c.causal;
  options.window_left = c.mods.window_left;
  options.window_right = c.mods.window_right;
  if (c.mods.softcap > 0) options.softcap = c.mods.softcap;
  selfattn::DeviceBuffer<float> slopes;
  selfattn::DeviceBuffer<unsigned char> bias;
  if (c.mods.alibi) {
    std::vector<float> host(size_t(c.heads));
    for (int h = 0; h < c.heads; ++h) host[h] = alibi_slope(c, h);
    slopes = selfattn::DeviceBuffer<float>(ctx, host.size(), "bench alibi slopes");
    slopes.copy_from_host(host);
    options.alibi_slopes = slopes.data();
    options.alibi_slopes_count = c.heads;
  }
  if (c.mods.bias != BiasKind::none) options.bias = make_bias(ctx, c, bias);
  selfattn::DeviceBuffer<float> sinks, dsinks;
  selfattn::BackwardOptions backward_options;
  if (c.mods.sinks) {
    std::vector<float> host(size_t(c.heads));
    for (int h = 0; h < c.heads; ++h) host[h] = sink_logit(c, h);
    sinks = selfattn::DeviceBuffer<float>(ctx, host.size(), "bench sinks");
    sinks.copy_from_host(host);
    options.sinks = sinks.data();
    // A training step with sinks learns them too: the backward computes their gradient.
    dsinks = selfattn::DeviceBuffer<float>(ctx, host.size(), "bench dsinks");
    backward_options.dsinks = dsinks.data();
  }
  const bool backward = c.direction != Direction::fwd;
  if (backward) add_backward_buffers(ctx, in);
  auto forward = [&](InputCache::Inputs::Set& set, float* lse) {
    selfattn::AttentionOptions with_lse = options;
    with_lse.lse = lse;
    selfattn::attention(ctx, view(set.q, c.heads, c.seq_q), view(set.k, c.kv_heads, c.seq_k),
                        v_view(set.v, c.kv_heads, c.seq_k), view_of(set.out, c.heads, c.seq_q, out_dtype(c), v_dim(c)),
                        with_lse);
  };
  auto run = [&](int copy) {
    InputCache::Inputs::Set& set = in.sets[size_t(copy) % in.sets.size()];
    if (c.direction != Direction::bwd) forward(set, backward ? set.lse.data() : nullptr);
    if (!backward) return;
    selfattn::attention_backward(ctx, view(set.q, c.heads, c.seq_q), view(set.k, c.kv_heads, c.seq_k),
                                 v_view(set.v, c.kv_heads, c.seq_k), v_view(set.out, c.heads, c.seq_q),
                                 v_view(set.dout, c.heads, c.seq_q), set.lse.data(), view(set.dq, c.heads, c.seq_q),
                                 view(set.dk, c.kv_heads, c.seq_k), v_view(set.dv, c.kv_heads, c.seq_k), options,
                                 backward_options);
  };

  // The first call doubles as the probe for support and as the checked run: its output is
  // poisoned with NaN beforehand so an element it never writes cannot pass.
  try {
    if (c.path == Path::automatic) {
      InputCache::Inputs::Set& set = in.sets[0];
      result.resolved_path = std::string("auto:") +
          name(selfattn::resolve_path(ctx, view(set.q, c.heads, c.seq_q), view(set.k, c.kv_heads, c.seq_k),
                                      v_view(set.v, c.kv_heads, c.seq_k), options));
    }
    in.sets[0].out.fill_bytes(0xFF);
    if (backward) {
      // The backward alone times attention_backward on each set's forward results, made here once.
      if (c.direction == Direction::bwd)
        for (InputCache::Inputs::Set& set : in.sets) forward(set, set.lse.data());
      for (auto* gradient : {&in.sets[0].dq, &in.sets[0].dk, &in.sets[0].dv}) gradient->fill_bytes(0xFF);
    }
    run(0);
    ctx.synchronize();
  } catch (const selfattn::NotAvailable& e) {
    result.note = e.what();
    return result;
  } catch (const selfattn::WorkspaceTooSmall& e) {
    result.note = e.what();
    return result;
  } catch (const selfattn::InvalidArgument& e) {
    result.note = e.what();
    return result;
  } catch (const std::exception& e) {
    result.status = Status::error;
    result.note = e.what();
    return result;
  }
  if (settings.check) {
    Case stored = c;  // out as the device holds it: FP8 inputs give bf16
    stored.dtype = out_dtype(c);
    const std::vector<float> out = from_device_bytes(in.sets[0].out.to_host(), stored, v_dim(c));
    const double tolerance = settings.tolerance.value_or(default_tolerance(c.dtype));
    if (c.direction != Direction::bwd)
      record_check(check_against_reference(c, in.q, in.k, in.v, out, tolerance, settings.whole_check_macs), result);
    if (backward && result.status != Status::check_failed) {
      Case kv_shape = c;  // dk and dv are [batch, kv_heads, seq_k, head_dim or v_dim]
      kv_shape.heads = c.kv_heads;
      kv_shape.seq_q = c.seq_k;
      const Gradients gradients{from_device_bytes(in.sets[0].dq.to_host(), c, c.head_dim),
                                from_device_bytes(in.sets[0].dk.to_host(), kv_shape, c.head_dim),
                                from_device_bytes(in.sets[0].dv.to_host(), kv_shape, v_dim(c))};
      const double bwd_tolerance = settings.tolerance.value_or(default_backward_tolerance(c.dtype));
      const AccuracyResult acc =
          check_backward_against_reference(c, in.q, in.k, in.v, in.dout, gradients, bwd_tolerance, settings.whole_check_macs);
      if (acc.compared) record_check(acc, result);
    }
  }

  try {
    for (int i = 0; i < settings.warmup; ++i) run(i + 1);
    CallTimer timer(ctx);
    for (int i = 0; i < settings.iters; ++i) {
      timer.begin();
      run(i);
      timer.end();
    }
    std::vector<double> ms = timer.collect_ms();
    std::sort(ms.begin(), ms.end());
    if (!ms.empty()) {
      result.ms_min = ms.front();
      result.ms_max = ms.back();
      result.ms_median = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
    }
  } catch (const std::exception& e) {
    result.status = Status::error;
    result.note = std::string("while timing: ") + e.what();
    return result;
  }
  // --profile: one more call of the timed operation, as the first timed call made it (input set 0),
  // after the timed ones so the profiler's cost (~70 ns a memory access) stays out of the times.
  if (!settings.profile_gpu.empty()) {
    try {
      result.profile = profile_call([&] { run(0); }, settings.profile_gpu);
    } catch (const std::exception& e) {
      result.status = Status::error;
      result.note = std::string("while profiling: ") + e.what();
      return result;
    }
  }
  if (result.ms_median > 0) {
    result.tflops = attention_flops(c) / (result.ms_median * 1e-3) / 1e12;
    result.gbps = attention_bytes(c) / (result.ms_median * 1e-3) / 1e9;
  }
  if (result.status != Status::check_failed) result.status = Status::ok;
  return result;
}

namespace {
// The (query, key) pairs a row block of seq_q rows sees.
double visible_pairs(const Case& c, int seq_q) {
  double pairs = 0;
  for (int row = 0; row < seq_q; ++row) {
    const selfattn::reference::KeyRange keys =
        selfattn::reference::visible_key_range(row, seq_q, c.seq_k, c.causal, c.mods.window_left, c.mods.window_right);
    pairs += keys.end - keys.begin;
  }
  return pairs;
}

// A decode step with a prefill chunk (DecodeShape::prefill_rows): each sequence its own rows.
bool mixed_step(const Case& c) { return c.decode && c.decode->prefill_rows > 0; }

// The (query, key) pairs every head computes.
double head_pairs(const Case& c) {
  double pairs = double(c.batch) * visible_pairs(c, c.seq_q);
  if (mixed_step(c)) {
    pairs = 0;
    for (int b = 0; b < c.batch; ++b) pairs += visible_pairs(c, c.decode->rows_of(b));
  }
  return pairs;
}

// Query rows of all sequences together.
double query_rows(const Case& c) {
  if (!mixed_step(c)) return double(c.batch) * c.seq_q;
  double rows = 0;
  for (int b = 0; b < c.batch; ++b) rows += c.decode->rows_of(b);
  return rows;
}
}  // namespace

double attention_flops(const Case& c) {
  // 2 FLOPs per multiply-add of each product per (query, key) pair: the forward's S = Q K^T over
  // head_dim and P V over v_dim; the backward's S again, dQ = dS K and dK = dS^T Q over head_dim,
  // dP = dO V^T and dV = P^T dO over v_dim (2.5x the forward's where the two are equal).
  const double per_pair = 2.0 * c.heads * head_pairs(c);
  const double forward = per_pair * (c.head_dim + v_dim(c));
  const double backward = per_pair * (3.0 * c.head_dim + 2.0 * v_dim(c));
  switch (c.direction) {
    case Direction::fwd: return forward;
    case Direction::bwd: return backward;
    case Direction::fwd_bwd: return forward + backward;
  }
  return forward;
}

double attention_bytes(const Case& c) {
  const double q_elems = query_rows(c) * c.heads * c.head_dim, out_elems = query_rows(c) * c.heads * v_dim(c);
  const double k_elems = double(c.batch) * c.kv_heads * c.seq_k * c.head_dim;
  // A latent cache's V is K's leading columns: read with K, no bytes of its own.
  const double v_elems = c.decode && c.decode->latent ? 0.0 : double(c.batch) * c.kv_heads * c.seq_k * v_dim(c);
  const double in = double(selfattn::dtype_size(c.dtype)), out = double(selfattn::dtype_size(out_dtype(c)));
  const double kv = double(selfattn::dtype_size(c.decode ? c.decode->kv_dtype : c.dtype));
  const double forward = q_elems * in + out_elems * out + (k_elems + v_elems) * kv;  // q, k, v read, out written
  // q, k, v, out, dout read; dq, dk, dv written
  const double backward = (2 * q_elems + 2 * out_elems + 2 * k_elems + 2 * v_elems) * in;
  return c.direction == Direction::fwd ? forward : c.direction == Direction::bwd ? backward : forward + backward;
}

}  // namespace selfattn_bench
