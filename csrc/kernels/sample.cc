#include "kernels/sample.h"

#include <cmath>
#include <limits>

namespace zrl {

std::size_t sample_categorical(const float* logits, std::size_t b, std::size_t n,
                               const double* u, std::int64_t* actions, float* logp) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < b; ++i) {
    const float* l = logits + i * n;
    double top = -kInf;
    for (std::size_t k = 0; k < n; ++k) {
      const double v = l[k];
      if (std::isnan(v) || v == kInf) return i;
      if (v > top) top = v;
    }
    if (top == -kInf) return i;  // every logit -inf (or no actions)
    double total = 0.0;
    for (std::size_t k = 0; k < n; ++k) total += std::exp(static_cast<double>(l[k]) - top);
    // Second pass: the same exp() values again (cheaper than scratch memory for a few actions).
    const double target = u[i] * total;
    double cum = 0.0;
    std::size_t pick = n, last = 0;
    for (std::size_t k = 0; k < n; ++k) {
      const double e = std::exp(static_cast<double>(l[k]) - top);
      if (e > 0.0) {
        last = k;
        cum += e;
        if (cum > target) {
          pick = k;
          break;
        }
      }
    }
    if (pick == n) pick = last;
    actions[i] = static_cast<std::int64_t>(pick);
    logp[i] = static_cast<float>((static_cast<double>(l[pick]) - top) - std::log(total));
  }
  return b;
}

std::size_t first_draw_outside_unit(const double* u, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (!(u[i] >= 0.0 && u[i] < 1.0)) return i;
  return n;
}

}  // namespace zrl
