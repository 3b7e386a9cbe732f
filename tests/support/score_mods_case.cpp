#include "score_mods_case.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "attention_harness.h"

namespace selfattn::testing {

const char* to_string(BiasLayout layout) {
  switch (layout) {
    case BiasLayout::none: return "none";
    case BiasLayout::full: return "full";
    case BiasLayout::heads: return "heads";
    case BiasLayout::batch: return "batch";
    case BiasLayout::keys: return "keys";
    case BiasLayout::stride0: return "stride0";
  }
  return "?";
}

bool ScoreModsCase::any() const {
  return window_left >= 0 || window_right >= 0 || softcap || alibi != AlibiSlopes::none || bias != BiasLayout::none ||
         sinks || dropout_p > 0;
}

std::string ScoreModsCase::name() const {
  std::ostringstream s;
  if (window_left >= 0 || window_right >= 0) s << " window=" << window_left << "," << window_right;
  if (softcap) s << " softcap=" << *softcap;
  if (alibi != AlibiSlopes::none) s << " alibi=" << (alibi == AlibiSlopes::heads ? "heads" : "batch_heads");
  if (bias != BiasLayout::none) {
    s << " bias=" << to_string(bias) << (bias_bool ? "/bool" : bias_in_input_dtype ? "/input" : "/f32");
    if (masked_row_period || masked_key_period)
      s << (mask_with_lowest ? " lowest=rows" : " -inf=rows") << masked_row_period << ",keys" << masked_key_period;
    if (bias_batch_gap) s << " bias_batch_gap=" << bias_batch_gap;
  }
  if (sinks) s << " sinks";
  if (dropout_p > 0) s << " dropout=" << dropout_p << "/seed" << dropout_seed << "/offset" << dropout_offset;
  return s.str();
}

ScoreModsData make_score_mods(Context& ctx, const ScoreModsCase& c, DType dtype, int batch, int heads, int seq_q,
                              int seq_k, std::mt19937_64& rng) {
  ScoreModsData data;
  data.batch = batch;
  data.heads = heads;
  data.seq_q = seq_q;
  data.seq_k = seq_k;

  if (c.alibi != AlibiSlopes::none) {
    // Slopes like ALiBi's geometric 2^(-8 h / heads), varied per batch so [batch, heads] differs.
    const int count = c.alibi == AlibiSlopes::heads ? heads : batch * heads;
    std::uniform_real_distribution<float> jitter(0.5f, 1.5f);
    std::vector<float> slopes(size_t(std::max(count, 1)));
    for (int i = 0; i < count; ++i) {
      slopes[i] = std::exp2(-8.0f * float(i % heads + 1) / float(heads)) * jitter(rng);
      data.slopes_logical.push_back(slopes[i]);
    }
    data.slopes = DeviceBuffer<float>(ctx, slopes.size(), "test alibi slopes");
    data.slopes.copy_from_host(slopes);
  }

  if (c.bias != BiasLayout::none) {
    const DType bias_type = c.bias_bool ? DType::b8 : c.bias_in_input_dtype ? dtype : DType::f32;
    const bool per_batch = c.bias == BiasLayout::full || c.bias == BiasLayout::batch;
    const bool per_head = c.bias == BiasLayout::full || c.bias == BiasLayout::heads;
    const int stored_batch = per_batch ? batch : 1, stored_heads = per_head ? heads : 1;
    const int64_t row_stride = c.bias == BiasLayout::full ? int64_t(seq_k) + 3 : seq_k;
    TensorView view;
    view.dtype = bias_type;
    view.shape = {stored_batch, stored_heads, seq_q, seq_k};
    view.strides = {int64_t(stored_heads) * seq_q * row_stride, int64_t(seq_q) * row_stride, row_stride, 1};
    if (c.bias == BiasLayout::stride0) {
      view.shape = {batch, heads, seq_q, seq_k};
      view.strides[0] = view.strides[1] = 0;
    }
    const int64_t block = int64_t(stored_heads) * seq_q * row_stride;  // elements of one stored batch
    if (per_batch) view.strides[0] = block + c.bias_batch_gap;
    const size_t elements = size_t(stored_batch) * stored_heads * seq_q * size_t(row_stride);
    std::vector<unsigned char> host(std::max<size_t>(elements, 1) * dtype_size(bias_type), 0);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const float minus_inf = -std::numeric_limits<float>::infinity();
    const float lowest = bias_type == DType::f16    ? -65504.0f
                         : bias_type == DType::bf16 ? -3.3895313892515355e38f
                                                    : std::numeric_limits<float>::lowest();
    const float masked_value = c.mask_with_lowest && !c.bias_bool ? lowest : minus_inf;
    std::vector<float> stored(elements, 0.0f);
    for (int b = 0; b < stored_batch; ++b)
      for (int h = 0; h < stored_heads; ++h)
        for (int r = 0; r < seq_q; ++r)
          for (int k = 0; k < seq_k; ++k) {
            const bool masked = (c.masked_row_period > 0 && r % c.masked_row_period == c.masked_row_period - 1) ||
                                (c.masked_key_period > 0 && k % c.masked_key_period == 1);
            const size_t at = ((size_t(b) * stored_heads + h) * seq_q + r) * size_t(row_stride) + k;
            stored[at] = masked ? masked_value : c.bias_bool ? 0.0f : round_to(bias_type, normal(rng));
            store_element(host.data(), bias_type, at, stored[at]);
          }
    // Batch by batch: with a gap, only the blocks are written.
    const size_t element = dtype_size(bias_type), block_bytes = size_t(block) * element;
    const size_t device_bytes = stored_batch > 0 ? size_t((stored_batch - 1) * view.strides[0] + block) * element : 0;
    data.bias_storage = DeviceBuffer<unsigned char>(ctx, std::max<size_t>(device_bytes, 1), "test bias");
    for (int b = 0; b < stored_batch; ++b)
      data.bias_storage.copy_from_host(host.data() + b * block_bytes, block_bytes, size_t(b * view.strides[0]) * element);
    view.data = data.bias_storage.data();
    data.bias = view;

    data.bias_logical.resize(size_t(batch) * heads * seq_q * seq_k);
    size_t i = 0;
    for (int b = 0; b < batch; ++b)
      for (int h = 0; h < heads; ++h)
        for (int r = 0; r < seq_q; ++r)
          for (int k = 0; k < seq_k; ++k, ++i) {
            const int sb = per_batch ? b : 0, sh = per_head ? h : 0;
            data.bias_logical[i] = stored[((size_t(sb) * stored_heads + sh) * seq_q + r) * size_t(row_stride) + k];
          }
  }

  if (c.sinks) {
    // Scores (scale q.k) of unit-normal inputs are about unit-normal; log(seq_k) is where a sink
    // holds as much weight as all the keys together.
    std::normal_distribution<float> normal(std::log(float(std::max(seq_k, 1))), 1.5f);
    std::vector<float> sinks(size_t(std::max(heads, 1)));
    for (int h = 0; h < heads; ++h) {
      sinks[size_t(h)] = h % 3 == 2 ? -std::numeric_limits<float>::infinity() : normal(rng);
      data.sinks_logical.push_back(sinks[size_t(h)]);
    }
    data.sinks = DeviceBuffer<float>(ctx, sinks.size(), "test sinks");
    data.sinks.copy_from_host(sinks);
  }
  return data;
}

void ScoreModsData::apply(const ScoreModsCase& c, reference::Problem& problem) const {
  problem.window_left = c.window_left;
  problem.window_right = c.window_right;
  problem.softcap = c.softcap ? double(*c.softcap) : 0.0;
  problem.alibi_slopes = slopes_logical;
  problem.bias = bias_logical;
  problem.sinks = sinks_logical;
  problem.dropout_p = c.dropout_p;
  problem.dropout_keep.clear();
  if (c.dropout_p > 0) {
    problem.dropout_keep = reference::dropout_keep_mask(c.dropout_p, c.dropout_seed, c.dropout_offset, problem.batch,
                                                        problem.heads, problem.seq_q, problem.seq_k);
  }
}

void ScoreModsData::apply_sequence(const ScoreModsCase& c, reference::Problem& problem, int b, int len_q,
                                   int len_k) const {
  problem.window_left = c.window_left;
  problem.window_right = c.window_right;
  problem.softcap = c.softcap ? double(*c.softcap) : 0.0;
  problem.sinks = sinks_logical;
  problem.dropout_p = c.dropout_p;
  problem.dropout_keep.clear();
  if (c.dropout_p > 0) {
    problem.dropout_keep = reference::dropout_keep_mask(c.dropout_p, c.dropout_seed, c.dropout_offset, 1, heads, len_q,
                                                        len_k, /*first_batch=*/b);
  }
  problem.alibi_slopes.clear();
  if (!slopes_logical.empty()) {
    const bool per_batch = slopes_logical.size() != size_t(heads);
    for (int h = 0; h < heads; ++h) problem.alibi_slopes.push_back(slopes_logical[per_batch ? size_t(b) * heads + h : h]);
  }
  problem.bias.clear();
  if (!bias_logical.empty()) {
    for (int h = 0; h < heads; ++h)
      for (int r = 0; r < len_q; ++r)
        for (int k = 0; k < len_k; ++k)
          problem.bias.push_back(bias_logical[((size_t(b) * heads + h) * seq_q + r) * seq_k + k]);
  }
}

}  // namespace selfattn::testing
