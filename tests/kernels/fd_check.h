// Finite-difference checking against float64 references.
//
// A kernel's backward is checked by: (1) a float64 re-implementation of its forward written in the
// test (plain loops), (2) a random projection L = Σ out·R, (3) central differences of L in float64
// for every input element, compared with the kernel's backward applied to dout = R.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "keel/core/dtype.h"

namespace keel::test {

inline std::vector<double> RandomVector(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// d/dx_i of f at x, by central differences with step eps (float64 throughout).
inline std::vector<double> NumericalGradient(
    const std::function<double(const std::vector<double>&)>& f, std::vector<double> x,
    double eps = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double keep = x[i];
    x[i] = keep + eps;
    double up = f(x);
    x[i] = keep - eps;
    double down = f(x);
    x[i] = keep;
    g[i] = (up - down) / (2 * eps);
  }
  return g;
}

// max |a-b| / (max |b| + floor): a relative error normalized by the reference's scale, so that
// entries near zero do not dominate.
inline double MaxRelError(const std::vector<double>& a, const std::vector<double>& b,
                          double floor = 1e-6) {
  double max_ref = floor, max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_ref = std::max(max_ref, std::abs(b[i]));
    max_diff = std::max(max_diff, std::abs(a[i] - b[i]));
  }
  return max_diff / max_ref;
}

template <typename T>
std::vector<T> ToTyped(const std::vector<double>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FromFloat<T>(float(v[i]));
  return out;
}

template <typename T>
std::vector<double> ToDouble(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = ToFloat(v[i]);
  return out;
}

// The values a T-typed kernel actually sees: inputs rounded to T and back.
template <typename T>
std::vector<double> RoundTrip(const std::vector<double>& v) {
  return ToDouble(ToTyped<T>(v));
}

// NumericalGradient at the listed indices only (result[k] is d/dx_{indices[k]}): for inputs too
// large to difference element by element in a unit test's time.
inline std::vector<double> NumericalGradientAt(
    const std::function<double(const std::vector<double>&)>& f, std::vector<double> x,
    const std::vector<size_t>& indices, double eps = 1e-6) {
  std::vector<double> g(indices.size());
  for (size_t k = 0; k < indices.size(); ++k) {
    size_t i = indices[k];
    double keep = x[i];
    x[i] = keep + eps;
    double up = f(x);
    x[i] = keep - eps;
    double down = f(x);
    x[i] = keep;
    g[k] = (up - down) / (2 * eps);
  }
  return g;
}

}  // namespace keel::test
