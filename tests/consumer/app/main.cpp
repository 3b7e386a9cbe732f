// Uses the installed selfattn: one small attention call, the same attention through a KV cache
// (kv_cache.h) and its backward (backward.h), all with attention sinks, on the context's backend,
// each checked against the CPU reference, and a context pinned to the mma.sync fused kernel. Exits 0
// only when all match.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include <selfattn/selfattn.h>

int main() {
  try {
    selfattn::Context ctx;
    const int heads = 2, seq = 7, dim = 8;
    std::vector<double> q(heads * seq * dim), k(q.size()), v(q.size());
    for (size_t i = 0; i < q.size(); ++i) {
      q[i] = std::sin(0.37 * double(i));
      k[i] = std::cos(0.11 * double(i));
      v[i] = std::sin(0.05 * double(i) + 1);
    }
    auto to_float = [](const std::vector<double>& d) { return std::vector<float>(d.begin(), d.end()); };
    selfattn::DeviceBuffer<float> qd(ctx, q.size()), kd(ctx, k.size()), vd(ctx, v.size()), out(ctx, q.size());
    qd.copy_from_host(to_float(q));
    kd.copy_from_host(to_float(k));
    vd.copy_from_host(to_float(v));
    auto view = [&](selfattn::DeviceBuffer<float>& b) {
      return selfattn::TensorView::bhsd(b.data(), selfattn::DType::f32, 1, heads, seq, dim);
    };
    const std::vector<float> sink_logits{0.75f, -0.5f};  // one per head
    selfattn::DeviceBuffer<float> sinks(ctx, heads);
    sinks.copy_from_host(sink_logits);
    selfattn::AttentionOptions options;
    options.causal = selfattn::Causal::top_left;
    options.sinks = sinks.data();
    selfattn::DeviceBuffer<float> lse(ctx, size_t(heads) * seq);
    options.lse = lse.data();
    selfattn::attention(ctx, view(qd), view(kd), view(vd), view(out), options);
    options.lse = nullptr;

    selfattn::reference::Problem problem;
    problem.heads = problem.kv_heads = heads;
    problem.seq_q = problem.seq_k = seq;
    problem.head_dim = dim;
    problem.causal = selfattn::Causal::top_left;
    problem.sinks.assign(sink_logits.begin(), sink_logits.end());
    // The reference sees the inputs as the device does: rounded to float.
    auto as_device_sees = [&](const std::vector<double>& d) {
      const std::vector<float> f = to_float(d);
      return std::vector<double>(f.begin(), f.end());
    };
    const auto ref = selfattn::reference::attention(problem, as_device_sees(q), as_device_sees(k), as_device_sees(v));
    auto relative_error_to = [&](selfattn::DeviceBuffer<float>& result, const std::vector<double>& want) {
      const std::vector<float> got = result.to_host();
      double error = 0, norm = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        error += (got[i] - want[i]) * (got[i] - want[i]);
        norm += want[i] * want[i];
      }
      return std::sqrt(error / norm);
    };
    auto relative_error = [&](selfattn::DeviceBuffer<float>& result) { return relative_error_to(result, ref.out); };

    // The backward of the first call for dout = v's values: dq, dk, dv against the reference's.
    selfattn::DeviceBuffer<float> dq(ctx, q.size()), dk(ctx, k.size()), dv(ctx, v.size()), dsinks(ctx, heads);
    selfattn::BackwardOptions backward;
    backward.dsinks = dsinks.data();
    selfattn::attention_backward(ctx, view(qd), view(kd), view(vd), view(out), view(vd), lse.data(), view(dq), view(dk),
                                 view(dv), options, backward);
    const auto grads = selfattn::reference::attention_backward(problem, as_device_sees(q), as_device_sees(k),
                                                               as_device_sees(v), as_device_sees(v));
    const double backward_relative = std::max({relative_error_to(dq, grads.dq), relative_error_to(dk, grads.dk),
                                               relative_error_to(dv, grads.dv), relative_error_to(dsinks, grads.dsinks)});

    // The same keys as a contiguous cache holding all seq tokens: with seq_q == length the cache's
    // bottom-right mask is the top-left one above.
    const std::vector<int32_t> length{seq};
    selfattn::DeviceBuffer<int32_t> lengths(ctx, 1);
    lengths.copy_from_host(length);
    selfattn::DeviceBuffer<float> cached_out(ctx, q.size());
    selfattn::KvAttentionOptions cached_options;
    cached_options.sinks = sinks.data();
    selfattn::attention_with_kv_cache(ctx, view(qd), selfattn::KvCache::contiguous(view(kd), view(vd), lengths.data()),
                                      view(cached_out), cached_options);

    // A context pinned to the mma.sync fused kernel says so (the option and its query are public).
    selfattn::ContextOptions pinned_options;
    pinned_options.hopper_kernels = false;
    const selfattn::Context pinned(pinned_options);
    const bool pinned_ok = !pinned.uses_hopper_kernels();

    const double relative = relative_error(out), cached_relative = relative_error(cached_out);
    std::printf("selfattn %s on %s: relative error %.2e, through a KV cache %.2e, backward %.2e, Hopper kernels %s\n",
                SELFATTN_VERSION_STRING, ctx.device_name().c_str(), relative, cached_relative, backward_relative,
                ctx.uses_hopper_kernels() ? "on" : "off");
    return relative < 1e-5 && cached_relative < 1e-5 && backward_relative < 1e-4 && pinned_ok ? 0 : 1;
  } catch (const selfattn::Error& e) {
    std::fprintf(stderr, "consumer_app: %s\n", e.what());
    return 1;
  }
}
