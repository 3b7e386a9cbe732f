// selfattn-demo: the seed document's worked example, computed by the library.
//
// The document follows one query, 它 ("it"), through self-attention over the three tokens
// 动物 ("animal"), 马路 ("street"), 它: project each embedding to a query, key and value, score
// the query against every key, scale by 1/sqrt(d_k), softmax into weights, and mix the values.
// This program has the library do each step through its public API on whichever backend the
// Context picks (a GPU when there is one, else the CPU simulator), and prints each result beside
// the CPU reference (double precision) and the value the document prints. Then it runs the whole
// 11-token sentence through self_attention().
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "selfattn/selfattn.h"
#include "worked_example.h"

namespace {

using selfattn::Context;
using selfattn::DeviceBuffer;
using selfattn::DType;
using selfattn::MatrixView;
using selfattn::TensorView;

using Rows = std::vector<std::array<double, demo::kDim>>;  // one d_k-wide row per token

DeviceBuffer<float> upload(Context& ctx, const std::vector<float>& values) {
  DeviceBuffer<float> buffer(ctx, values.size());
  buffer.copy_from_host(values);
  return buffer;
}

std::vector<float> embeddings(const std::vector<int>& tokens) {
  std::vector<float> x;
  for (int t : tokens) x.insert(x.end(), demo::kX[t], demo::kX[t] + demo::kModel);
  return x;
}

std::vector<float> flatten(const float (&w)[demo::kModel][demo::kDim]) { return {&w[0][0], &w[0][0] + demo::kModel * demo::kDim}; }

Rows to_rows(const std::vector<float>& flat) {
  Rows rows(flat.size() / demo::kDim);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = {flat[i * 2], flat[i * 2 + 1]};
  return rows;
}

// X W for the given tokens, by the library. A sequence of one token attends only to itself (a
// softmax over one score is 1), so self_attention() over one-token sequences returns each token's
// value row x W^V: the projection itself.
Rows project(Context& ctx, const std::vector<int>& tokens, const float (&w)[demo::kModel][demo::kDim]) {
  const auto n = int64_t(tokens.size());
  DeviceBuffer<float> x = upload(ctx, embeddings(tokens));
  DeviceBuffer<float> weights = upload(ctx, flatten(w));
  DeviceBuffer<float> out(ctx, size_t(n * demo::kDim));
  const MatrixView wm = MatrixView::row_major(weights.data(), DType::f32, demo::kModel, demo::kDim);
  selfattn::self_attention(ctx, TensorView::bhsd(x.data(), DType::f32, n, 1, 1, demo::kModel), wm, wm, wm, 1,
                           TensorView::bhsd(out.data(), DType::f32, n, 1, 1, demo::kDim));
  return to_rows(out.to_host());
}

struct Attended {
  Rows out;
  std::vector<float> lse;
  selfattn::Path path;  // the path `automatic` chose
};

// The token padded to `columns` terminal columns (each CJK character is 3 UTF-8 bytes wide 2 columns).
std::string padded(const char* token, size_t columns) {
  std::string text = token;
  const size_t width = text.size() / 3 * 2;
  return text + std::string(columns > width ? columns - width : 0, ' ');
}

// attention(q, k, v) over one sequence, with its log-sum-exp per query row.
Attended attend(Context& ctx, const Rows& q, const Rows& k, const Rows& v) {
  auto flat = [](const Rows& rows) {
    std::vector<float> values;
    for (const auto& row : rows) values.insert(values.end(), row.begin(), row.end());
    return values;
  };
  DeviceBuffer<float> qd = upload(ctx, flat(q)), kd = upload(ctx, flat(k)), vd = upload(ctx, flat(v));
  DeviceBuffer<float> out(ctx, q.size() * demo::kDim), lse(ctx, q.size());
  selfattn::AttentionOptions options;  // scale defaults to 1/sqrt(d_k)
  options.lse = lse.data();
  auto view = [](DeviceBuffer<float>& b, size_t rows) {
    return TensorView::bhsd(b.data(), DType::f32, 1, 1, int64_t(rows), demo::kDim);
  };
  const TensorView qv = view(qd, q.size()), kv = view(kd, k.size()), vv = view(vd, v.size());
  selfattn::attention(ctx, qv, kv, vv, view(out, q.size()), options);
  return {to_rows(out.to_host()), lse.to_host(), selfattn::resolve_path(ctx, qv, kv, vv, options)};
}

// Double-precision projections for the reference.
Rows project_exactly(const std::vector<int>& tokens, const float (&w)[demo::kModel][demo::kDim]) {
  Rows rows;
  for (int t : tokens) {
    std::array<double, demo::kDim> row{};
    for (int j = 0; j < demo::kDim; ++j)
      for (int i = 0; i < demo::kModel; ++i) row[j] += double(demo::kX[t][i]) * double(w[i][j]);
    rows.push_back(row);
  }
  return rows;
}

std::vector<double> flat(const Rows& rows) {
  std::vector<double> values;
  for (const auto& row : rows) values.insert(values.end(), row.begin(), row.end());
  return values;
}

selfattn::reference::Result reference_attention(const std::vector<int>& tokens) {
  selfattn::reference::Problem problem;
  problem.seq_q = problem.seq_k = int(tokens.size());
  problem.head_dim = demo::kDim;
  return selfattn::reference::attention(problem, flat(project_exactly(tokens, demo::kWQ)),
                                        flat(project_exactly(tokens, demo::kWK)),
                                        flat(project_exactly(tokens, demo::kWV)));
}

void print_rows(const char* name, const Rows& library, const Rows& exact, const double (&printed)[3][2]) {
  for (int i = 0; i < 3; ++i) {
    const char* token = demo::kTokenText[size_t(demo::kExampleTokens[size_t(i)])];
    std::printf("  %s %s library [%8.5f, %8.5f]   reference [%8.5f, %8.5f]   document [%g, %g]\n", name,
                padded(token, 4).c_str(),
                library[size_t(i)][0], library[size_t(i)][1], exact[size_t(i)][0], exact[size_t(i)][1], printed[i][0],
                printed[i][1]);
  }
}

int run() {
  Context ctx;
  std::printf("selfattn %s demo: the seed document's worked example, computed by the library\n", SELFATTN_VERSION_STRING);
  std::printf("backend: %s (%s)\n\n", selfattn::to_string(ctx.backend()), ctx.device_name().c_str());

  const std::vector<int> example(demo::kExampleTokens.begin(), demo::kExampleTokens.end());
  std::printf("Example: the sequence 动物 马路 它 (d_model %d, d_k %d); the query is 它.\n", demo::kModel, demo::kDim);
  std::printf("1. Projections Q = X W^Q, K = X W^K, V = X W^V\n");
  const Rows q = project(ctx, example, demo::kWQ), k = project(ctx, example, demo::kWK), v = project(ctx, example, demo::kWV);
  print_rows("Q", q, project_exactly(example, demo::kWQ), demo::kPrintedQ);
  print_rows("K", k, project_exactly(example, demo::kWK), demo::kPrintedK);
  print_rows("V", v, project_exactly(example, demo::kWV), demo::kPrintedV);

  // Steps 2 and 3 are the arithmetic inside attention(), shown on the library's Q and K.
  const double scale = 1 / std::sqrt(double(demo::kDim));
  std::printf("\n2. Scores of 它: q(它) . k(each token), from the library's Q and K\n  ");
  for (int j = 0; j < 3; ++j) std::printf(" %.5f", q[2][0] * k[size_t(j)][0] + q[2][1] * k[size_t(j)][1]);
  std::printf("   document: %g %g %g\n", demo::kPrintedScores[0], demo::kPrintedScores[1], demo::kPrintedScores[2]);
  std::printf("3. Scaled by 1/sqrt(d_k) = %.5f\n  ", scale);
  for (int j = 0; j < 3; ++j) std::printf(" %.5f", scale * (q[2][0] * k[size_t(j)][0] + q[2][1] * k[size_t(j)][1]));
  std::printf("   document: %g %g %g\n", demo::kPrintedScaled[0], demo::kPrintedScaled[1], demo::kPrintedScaled[2]);

  const Attended attended = attend(ctx, q, k, v);
  const selfattn::reference::Result exact = reference_attention(example);
  std::printf("   (attention() ran on path %s)\n", selfattn::to_string(attended.path));
  std::printf("4. Softmax denominator sum_j exp(scaled_j) = exp(LSE of 它)\n");
  std::printf("   library %.6f   reference %.6f   document %.16g (from the rounded scaled scores)\n",
              std::exp(double(attended.lse[2])), std::exp(exact.lse[2]), demo::kPrintedDenominator);

  // attention() with one-hot values returns the softmax weights themselves: with v_j = (1 if j == m
  // else 0, 0), out(它)[0] = sum_j w_j v_j[0] = w_m.
  std::printf("5. Softmax weights (attention() with one-hot values v_j = [j == m, 0] returns w_m)\n");
  std::array<double, 3> weights{};
  for (int m = 0; m < 3; ++m) {
    Rows one_hot(3, {0.0, 0.0});
    one_hot[size_t(m)][0] = 1;
    weights[size_t(m)] = attend(ctx, q, k, one_hot).out[2][0];
  }
  std::printf("   library weights of 它: %.3f %.3f %.3f   (document: %g %g %g; unrounded %.5f %.5f %.5f)\n",
              weights[0], weights[1], weights[2], demo::kPrintedWeights[0], demo::kPrintedWeights[1],
              demo::kPrintedWeights[2], weights[0], weights[1], weights[2]);

  const auto& it = attended.out[2];
  std::printf("6. Output of 它 = sum_j w_j v_j\n");
  std::printf("   library output of 它: [%.3f, %.3f]   (unrounded [%.5f, %.5f])\n", it[0], it[1], it[0], it[1]);
  std::printf("   reference: exact [%.4f, %.4f]; the document prints [%.3f, %.3f] (it rounds the weights first)\n",
              exact.out[4], exact.out[5], demo::kPrintedOutput[0], demo::kPrintedOutput[1]);

  // The whole sentence: one call from embeddings to outputs.
  std::vector<int> sentence(demo::kTokens);
  for (int t = 0; t < demo::kTokens; ++t) sentence[size_t(t)] = t;
  DeviceBuffer<float> x = upload(ctx, embeddings(sentence));
  DeviceBuffer<float> wq = upload(ctx, flatten(demo::kWQ)), wk = upload(ctx, flatten(demo::kWK)),
                      wv = upload(ctx, flatten(demo::kWV));
  DeviceBuffer<float> out(ctx, size_t(demo::kTokens * demo::kDim));
  auto matrix = [](DeviceBuffer<float>& w) { return MatrixView::row_major(w.data(), DType::f32, demo::kModel, demo::kDim); };
  selfattn::self_attention(ctx, TensorView::bhsd(x.data(), DType::f32, 1, 1, demo::kTokens, demo::kModel), matrix(wq),
                           matrix(wk), matrix(wv), 1, TensorView::bhsd(out.data(), DType::f32, 1, 1, demo::kTokens, demo::kDim));
  const Rows library = to_rows(out.to_host());
  const selfattn::reference::Result sentence_exact = reference_attention(sentence);
  std::printf("\nThe whole sentence 这个动物并没有过马路，因为它太累了 through self_attention():\n");
  double max_error = 0;
  for (int t = 0; t < demo::kTokens; ++t) {
    const double* ref = &sentence_exact.out[size_t(t) * 2];
    std::printf("  %s library [%9.6f, %9.6f]   reference [%9.6f, %9.6f]\n", padded(demo::kTokenText[size_t(t)], 4).c_str(),
                library[size_t(t)][0], library[size_t(t)][1], ref[0], ref[1]);
    for (int j = 0; j < 2; ++j) max_error = std::max(max_error, std::abs(library[size_t(t)][size_t(j)] - ref[j]));
  }
  const bool ok = max_error < 1e-5;  // fp32 storage of inputs and outputs, values of order 0.1
  std::printf("whole sentence: %d tokens, max |library - reference| %.2e %s\n", demo::kTokens, max_error,
              ok ? "OK" : "TOO LARGE");
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const selfattn::NotAvailable& e) {
    std::fprintf(stderr, "selfattn-demo: not available: %s\n", e.what());
  } catch (const selfattn::Error& e) {
    std::fprintf(stderr, "selfattn-demo: %s\n", e.what());
  }
  return 1;
}
