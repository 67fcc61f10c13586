// Double-precision scalar reference of the update rules (adam.h, adagrad.h, lion.h), written
// straight from the formulas, for the tests to compare the SIMD kernels against.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "optimizer_cpu/adagrad.h"
#include "optimizer_cpu/adam.h"
#include "optimizer_cpu/lion.h"

namespace zinf::optimizer_cpu::testing {

// g holds the gradients already multiplied by grad_scale.
inline void reference_adam(const AdamConfig& c, std::int64_t t, std::vector<double>& p,
                           std::vector<double>& m, std::vector<double>& v,
                           const std::vector<double>& g) {
  const double b1 = c.beta1, b2 = c.beta2, lr = c.lr, wd = c.weight_decay;
  const double bc1 = c.bias_correction ? 1.0 - std::pow(b1, static_cast<double>(t)) : 1.0;
  const double bc2 = c.bias_correction ? 1.0 - std::pow(b2, static_cast<double>(t)) : 1.0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    double grad = g[i];
    if (!c.adamw_mode) grad += wd * p[i];
    m[i] = b1 * m[i] + (1.0 - b1) * grad;
    v[i] = b2 * v[i] + (1.0 - b2) * grad * grad;
    if (c.adamw_mode) p[i] -= lr * wd * p[i];
    p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + c.eps);
  }
}

inline void reference_adagrad(const AdagradConfig& c, std::int64_t t, std::vector<double>& p,
                              std::vector<double>& sum, const std::vector<double>& g) {
  const double clr = c.lr / (1.0 + static_cast<double>(t - 1) * c.lr_decay);
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double grad = g[i] + static_cast<double>(c.weight_decay) * p[i];
    sum[i] += grad * grad;
    p[i] -= clr * grad / (std::sqrt(sum[i]) + c.eps);
  }
}

inline void reference_lion(const LionConfig& c, std::vector<double>& p, std::vector<double>& m,
                           const std::vector<double>& g) {
  const double b1 = c.beta1, b2 = c.beta2, lr = c.lr;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double update = b1 * m[i] + (1.0 - b1) * g[i];
    const double sign = update > 0 ? 1.0 : (update < 0 ? -1.0 : 0.0);
    p[i] -= lr * static_cast<double>(c.weight_decay) * p[i];
    p[i] -= lr * sign;
    m[i] = b2 * m[i] + (1.0 - b2) * g[i];
  }
}

}  // namespace zinf::optimizer_cpu::testing
