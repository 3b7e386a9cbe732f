// The variable-length check (attention_harness.h): VarlenCase's name and check_attention_varlen, each
// sequence judged against the reference run on it alone.
#include "attention_harness.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "harness_tensors.h"

namespace selfattn::testing {

using namespace harness;

std::string VarlenCase::name() const {
  std::ostringstream s;
  s << selfattn::to_string(dtype) << " varlen h" << heads << "/" << kv_heads << " d" << head_dim;
  if (head_dim_v > 0) s << " dv" << head_dim_v;
  s << " q=[";
  for (size_t i = 0; i < seq_q.size(); ++i) s << (i ? "," : "") << seq_q[i];
  s << "] k=[";
  for (size_t i = 0; i < seq_k.size(); ++i) s << (i ? "," : "") << seq_k[i];
  s << "] causal=" << selfattn::to_string(causal) << " " << to_string(layout)
    << (strides == Strides::shared ? " shared_strides" : "") << (with_lse ? " lse" : "") << " "
    << selfattn::to_string(path);
  if (misalign) s << " misalign=" << misalign;
  if (unowned_q_rows || unowned_k_rows) s << " unowned=" << unowned_q_rows << "/" << unowned_k_rows;
  s << harness::values_name("key_start", key_start) << harness::values_name("q_offset", q_offset)
    << harness::values_name("key_lengths", key_lengths);
  if (fp8) s << " fp8=" << selfattn::to_string(*fp8);
  return s.str();
}

::testing::AssertionResult check_attention_varlen(Context& ctx, const VarlenCase& c, Measured* measured) {
  return check_attention_varlen(ctx, c, ScoreModsCase{}, measured);
}

::testing::AssertionResult check_attention_varlen(Context& ctx, const VarlenCase& c, const ScoreModsCase& mods_case,
                                                  Measured* measured) {
  if (c.seq_q.size() != c.seq_k.size()) return ::testing::AssertionFailure() << c.name() << ": seq_q and seq_k differ in size";
  const int batch = int(c.seq_q.size());
  std::vector<int32_t> cu_q(1, 0), cu_k(1, 0);
  for (int b = 0; b < batch; ++b) {
    cu_q.push_back(cu_q.back() + c.seq_q[b]);
    cu_k.push_back(cu_k.back() + c.seq_k[b]);
  }
  // The views' rows: the sequences' then those no sequence owns.
  const int total_q = cu_q.back() + c.unowned_q_rows, total_k = cu_k.back() + c.unowned_k_rows;
  // The packed tensors are padded calls of batch 1 over the total lengths.
  AttentionCase packed;
  packed.dtype = c.dtype;
  packed.batch = 1;
  packed.head_dim = c.head_dim;
  packed.head_dim_v = c.head_dim_v;
  packed.layout = c.layout;
  packed.strides = c.strides;
  packed.misalign = c.misalign;
  packed.fp8 = c.fp8;
  std::mt19937_64 rng(input_seed(c.name()));
  Operand q = make_operand(ctx, packed, Role::q, c.heads, total_q, rng, "test q", Keys::random, false, c.unowned_q_rows);
  Operand k = make_operand(ctx, packed, Role::k, c.kv_heads, total_k, rng, "test k", Keys::random, false,
                           c.unowned_k_rows);
  Operand v = make_operand(ctx, packed, Role::v, c.kv_heads, total_k, rng, "test v", Keys::random, false,
                           c.unowned_k_rows);
  DeviceBuffer<float> descales[3];
  if (c.fp8) {
    // Each row's sequence (rows no sequence owns: the last one; their logical values are 0).
    auto sequence_of_rows = [&](const std::vector<int32_t>& cu, int total) {
      std::vector<int> rows(size_t(total), std::max(batch - 1, 0));
      for (int b = 0; b < batch; ++b)
        for (int r = cu[b]; r < cu[b + 1]; ++r) rows[size_t(r)] = b;
      return rows;
    };
    apply_fp8_descales(q, Role::q, 1, c.heads, c.heads / c.kv_heads, total_q, c.head_dim,
                       sequence_of_rows(cu_q, total_q));
    apply_fp8_descales(k, Role::k, 1, c.kv_heads, 1, total_k, c.head_dim, sequence_of_rows(cu_k, total_k));
    apply_fp8_descales(v, Role::v, 1, c.kv_heads, 1, total_k, c.v_dim(), sequence_of_rows(cu_k, total_k));
    for (Role role : {Role::q, Role::k, Role::v}) {
      DeviceBuffer<float>& buffer = descales[int(role)];
      buffer = DeviceBuffer<float>(ctx, std::max(batch * c.kv_heads, 1), "test descale");
      buffer.copy_from_host(fp8_descales(role, batch, c.kv_heads));
    }
  }
  // Key rows a sequence does not use (before its key_start, past its key length) hold NaN on the device.
  for (Operand* op : {&k, &v}) {
    std::vector<unsigned char> bytes = download(op->tensor, 1);
    for (int b = 0; b < batch; ++b)
      for (int r = 0; r < c.seq_k[b]; ++r) {
        const bool before = !c.key_start.empty() && r < c.key_start[size_t(b)];
        const bool past = !c.key_lengths.empty() && r >= c.key_lengths[size_t(b)];
        if (!before && !past) continue;
        for (int h = 0; h < c.kv_heads; ++h)
          for (int e = 0; e < op->tensor.view.head_dim(); ++e)
            store_element(bytes.data(), op->tensor.view.dtype, host_index(op->tensor, 0, h, cu_k[b] + r, e), NAN);
      }
    upload(op->tensor, bytes, 1);
  }
  DeviceTensor out_tensor = make_tensor(ctx, packed, Role::out, c.heads, total_q, "test out");
  upload(out_tensor, std::vector<unsigned char>(out_tensor.batch_bytes, 0xFF), 1);
  const size_t lse_count = size_t(c.heads) * total_q;
  DeviceBuffer<float> lse_buffer(ctx, std::max<size_t>(lse_count, 1), "test lse");
  lse_buffer.fill_bytes(0xFF);
  DeviceBuffer<int32_t> cu_q_device(ctx, cu_q.size(), "test cu_seqlens_q"), cu_k_device(ctx, cu_k.size(), "test cu_seqlens_k");
  cu_q_device.copy_from_host(cu_q);
  cu_k_device.copy_from_host(cu_k);

  AttentionOptions options;
  options.path = c.path;
  options.causal = c.causal;
  if (c.with_lse) options.lse = lse_buffer.data();
  if (c.fp8) {
    options.q_descale = descales[0].data();
    options.k_descale = descales[1].data();
    options.v_descale = descales[2].data();
  }
  DeviceBuffer<int32_t> key_start, q_offset, key_lengths;
  options.key_lengths = upload_ints(ctx, key_lengths, c.key_lengths, "test key_lengths");
  options.key_start = upload_ints(ctx, key_start, c.key_start, "test key_start");
  options.q_offset = upload_ints(ctx, q_offset, c.q_offset, "test q_offset");
  const int max_q = batch ? *std::max_element(c.seq_q.begin(), c.seq_q.end()) : 0;
  const int max_k = batch ? *std::max_element(c.seq_k.begin(), c.seq_k.end()) : 0;
  ScoreModsData mods;
  if (mods_case.any()) {
    mods = make_score_mods(ctx, mods_case, c.dtype, batch, c.heads, max_q, max_k, rng);
    mods.apply(mods_case, options);
  }
  try {
    attention_varlen(ctx, q.tensor.view, k.tensor.view, v.tensor.view, out_tensor.view, cu_q_device.data(),
                     cu_k_device.data(), batch, max_q, max_k, options);
    ctx.synchronize();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << c.name() << ": attention_varlen threw: " << e.what();
  }
  const std::vector<unsigned char> out_host = download(out_tensor, 1);
  const std::vector<float> lse_host = lse_buffer.to_host();
  // Neither the gaps nor the rows no sequence owns were written (attention.h): still poison.
  if (::testing::AssertionResult gaps = gaps_untouched(out_host, out_tensor.view, "out"); !gaps)
    return ::testing::AssertionFailure() << c.name() << ": " << gaps.message();
  for (int h = 0; h < c.heads; ++h)
    for (int r = cu_q.back(); r < total_q; ++r) {
      for (int e = 0; e < c.v_dim(); ++e)
        for (size_t byte = 0; byte < out_tensor.element; ++byte)
          if (out_host[host_index(out_tensor, 0, h, r, e) * out_tensor.element + byte] != 0xFF)
            return ::testing::AssertionFailure() << c.name() << ": out's row " << r << " of head " << h
                                                 << ", which no sequence owns, was written";
      if (c.with_lse && !std::isnan(lse_host[size_t(h) * total_q + r]))
        return ::testing::AssertionFailure() << c.name() << ": lse's row " << r << " of head " << h
                                             << ", which no sequence owns, was written";
    }

  AttentionArithmetic arithmetic;
  arithmetic.dtype = c.dtype;
  set_probability_rounding(ctx, c.path, q.tensor.view, k.tensor.view, v.tensor.view, out_tensor.view, options,
                           arithmetic, /*varlen=*/true);
  // Each sequence against the reference run on it alone; the parts are judged as one result.
  AttentionExpected expected;
  expected.out.row_length = c.v_dim();
  std::vector<double> out, lse;
  std::vector<std::string> row_names;
  const int d = c.head_dim;
  for (int b = 0; b < batch; ++b) {
    if (c.seq_q[b] == 0) continue;
    // This sequence alone, as the reference takes it: contiguous [1, heads, len, d].
    auto slice = [&](const Operand& op, int heads, int total, int first, int len) {
      const int cols = int(op.tensor.view.head_dim());  // q and k: head_dim; v: v_dim()
      std::vector<double> part(size_t(heads) * len * cols);
      for (int h = 0; h < heads; ++h)
        for (int r = 0; r < len; ++r)
          for (int e = 0; e < cols; ++e)
            part[(size_t(h) * len + r) * cols + e] = op.logical[(size_t(h) * total + first + r) * cols + e];
      return part;
    };
    reference::Problem problem;
    problem.heads = c.heads;
    problem.kv_heads = c.kv_heads;
    problem.seq_q = c.seq_q[b];
    problem.seq_k = c.seq_k[b];
    problem.head_dim = d;
    problem.head_dim_v = c.head_dim_v;
    problem.causal = c.causal;
    if (!c.key_start.empty()) problem.key_start = {c.key_start[size_t(b)]};
    if (!c.key_lengths.empty()) problem.key_lengths = {c.key_lengths[size_t(b)]};
    if (!c.q_offset.empty()) problem.q_offset = {c.q_offset[size_t(b)]};
    if (mods_case.any()) mods.apply_sequence(mods_case, problem, b, c.seq_q[b], c.seq_k[b]);
    const AttentionExpected part =
        expected_attention(problem, slice(q, c.heads, total_q, cu_q[b], c.seq_q[b]),
                           slice(k, c.kv_heads, total_k, cu_k[b], c.seq_k[b]),
                           slice(v, c.kv_heads, total_k, cu_k[b], c.seq_k[b]), arithmetic);
    expected.out.append(part.out);
    expected.lse.append(part.lse);
    const std::vector<double> part_out = out_values(out_tensor, out_host, 1, c.heads, cu_q[b], c.seq_q[b]);
    out.insert(out.end(), part_out.begin(), part_out.end());
    for (int h = 0; h < c.heads; ++h)
      for (int r = 0; r < c.seq_q[b]; ++r) {
        lse.push_back(lse_host[size_t(h) * total_q + cu_q[b] + r]);
        row_names.push_back("sequence " + std::to_string(b) + " head " + std::to_string(h) + " query " + std::to_string(r));
      }
  }
  Measured m;
  ::testing::AssertionResult verdict = judge_attention(c.name(), expected, out, c.with_lse ? &lse : nullptr,
                                                       [&](size_t row) { return row_names[row]; }, m);
  if (measured) *measured = m;
  if (std::getenv("SELFATTN_TEST_REPORT") != nullptr) print_report(c.name(), m);
  return verdict;
}

}  // namespace selfattn::testing
