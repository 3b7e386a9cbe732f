#include "judge.h"

#include <algorithm>
#include <cmath>

namespace selfattn::testing {

double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::f32: return std::ldexp(1.0, -24);
    case DType::f16: return std::ldexp(1.0, -11);
    case DType::bf16: return std::ldexp(1.0, -8);
    case DType::b8: return 0;  // a mask is exact
    case DType::e4m3: return std::ldexp(1.0, -4);
    case DType::e5m2: return std::ldexp(1.0, -3);
  }
  return 0;
}

double rounding_floor(DType stored, double fp32_roundings, double scale) {
  return (unit_roundoff(stored) + unit_roundoff(DType::f32) * fp32_roundings) * scale;
}

void Expected::append(const Expected& other) {
  exact.insert(exact.end(), other.exact.begin(), other.exact.end());
  allowed.insert(allowed.end(), other.allowed.begin(), other.allowed.end());
  scale.insert(scale.end(), other.scale.begin(), other.scale.end());
  floor.insert(floor.end(), other.floor.begin(), other.floor.end());
}

namespace {

// Sums of squares of one group (an element, a row, the whole result), in scale units: the path's
// error, the allowed computation's error, the floor. Elements judged by exactness are not counted.
struct Group {
  double error2 = 0, allowed2 = 0, floor2 = 0;
  size_t count = 0;
  void add(double error, double allowed, double floor) {
    error2 += error * error;
    allowed2 += allowed * allowed;
    floor2 += floor * floor;
    ++count;
  }
  double error() const { return count ? std::sqrt(error2 / double(count)) : 0.0; }
  double allowed() const { return count ? std::sqrt(allowed2 / double(count)) : 0.0; }
  // The floor covers the luck of one sample of the allowed computation; over a group of count
  // elements that luck averages out as 1 / sqrt(count), and so does the floor.
  double floor() const { return count ? std::sqrt(floor2) / double(count) : 0.0; }
};

// error / bound, 0 when both are 0 (an exact result where nothing was allowed).
double ratio(double error, double bound) { return error == 0 ? 0.0 : error / bound; }

}  // namespace

::testing::AssertionResult judge(const std::string& what, const std::vector<double>& got, const Expected& expected,
                                 Judgement* judgement, const RowNamer& row_name) {
  const size_t n = expected.size();
  const size_t row_length = size_t(std::max(expected.row_length, 1));
  if (got.size() != n || expected.allowed.size() != n || expected.scale.size() != n || expected.floor.size() != n)
    return ::testing::AssertionFailure() << what << ": " << got.size() << " values judged against " << n;
  auto row_where = [&](size_t row) { return row_name ? row_name(row) : "row " + std::to_string(row); };
  auto where = [&](size_t i) {
    return row_where(i / row_length) + (row_length > 1 ? " column " + std::to_string(i % row_length) : "");
  };

  // Pass 1: exactness and finiteness; each element's normalised errors; the allowed worst cases.
  std::vector<double> error(n, 0.0), allowed(n, 0.0), floor(n, 0.0);
  std::vector<bool> measured(n, false);
  std::vector<Group> rows((n + row_length - 1) / row_length);
  Group all;
  double worst_allowed_element = 0;
  for (size_t i = 0; i < n; ++i) {
    const double value = got[i], exact = expected.exact[i], scale = expected.scale[i];
    if (!std::isfinite(value) && value != exact)
      return ::testing::AssertionFailure() << what << " at " << where(i) << " is " << value
                                           << " (never written, or not finite); expected " << exact;
    if (!std::isfinite(exact) || scale == 0) {
      if (value != exact)
        return ::testing::AssertionFailure() << what << " at " << where(i) << " is " << value << ", expected exactly "
                                             << exact;
      continue;
    }
    error[i] = std::abs(value - exact) / scale;
    allowed[i] = std::abs(expected.allowed[i] - exact) / scale;
    floor[i] = expected.floor[i] / scale;
    measured[i] = true;
    rows[i / row_length].add(error[i], allowed[i], floor[i]);
    all.add(error[i], allowed[i], floor[i]);
    worst_allowed_element = std::max(worst_allowed_element, allowed[i]);
  }
  double worst_allowed_row = 0;
  for (const Group& row : rows) worst_allowed_row = std::max(worst_allowed_row, row.allowed());

  // Pass 2: each level against K x the allowed worst case at that level + the floor. Every level is
  // measured before any verdict, so a report shows all three ratios.
  constexpr double K = kAllowedErrorMultiple;
  Judgement j;
  j.allowed_element = worst_allowed_element;
  j.allowed_row = worst_allowed_row;
  j.allowed_all = all.allowed();
  struct Worst {
    double ratio = 0, error = 0, floor = 0;
    size_t first = 0, count = 0;  // the group: elements [first, first + count)
  };
  Worst element, row, overall;
  for (size_t i = 0; i < n; ++i) {
    if (!measured[i]) continue;
    const double r = ratio(error[i], K * worst_allowed_element + floor[i]);
    if (r > element.ratio) element = {r, error[i], floor[i], i, 1};
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    if (rows[r].count == 0) continue;
    const double q = ratio(rows[r].error(), K * worst_allowed_row + rows[r].floor());
    if (q > row.ratio) row = {q, rows[r].error(), rows[r].floor(), r * row_length, std::min(row_length, n - r * row_length)};
  }
  if (all.count > 0) overall = {ratio(all.error(), K * all.allowed() + all.floor()), all.error(), all.floor(), 0, n};
  j.element = element.ratio;
  j.row = row.ratio;
  j.all = overall.ratio;
  if (judgement) *judgement = j;

  auto verdict = [&](const char* level, const Worst& w, double allowed_worst) -> ::testing::AssertionResult {
    const size_t worst = size_t(std::max_element(error.begin() + long(w.first), error.begin() + long(w.first + w.count)) -
                                error.begin());
    ::testing::AssertionResult result = ::testing::AssertionFailure();
    result << what << ": " << level << " error at "
           << (w.count == n && n > 1 ? "all elements" : w.count > 1 ? row_where(w.first / row_length) : where(w.first));
    if (w.count > 1) result << " (worst " << where(worst) << ")";
    result << " is " << w.error << " in units of the element scale, above " << K << " x allowed " << allowed_worst
           << " + floor " << w.floor << " (error / bound: element " << j.element << ", row " << j.row << ", overall "
           << j.all << "); there got " << got[worst] << ", exact " << expected.exact[worst] << ", allowed computation "
           << expected.allowed[worst] << ", scale " << expected.scale[worst];
    return result;
  };
  if (!(element.ratio <= 1)) return verdict("element", element, worst_allowed_element);
  if (!(row.ratio <= 1)) return verdict("row RMS", row, worst_allowed_row);
  if (!(overall.ratio <= 1)) return verdict("overall RMS", overall, all.allowed());
  return ::testing::AssertionSuccess();
}

}  // namespace selfattn::testing
