// V-trace as two passes over [T, B]: a vectorisable pass that turns log-ratios
// into ratios (written into pg_advantages, which doubles as scratch), then one
// backward scan over t whose inner loop runs over the contiguous B axis, so the
// compiler vectorises it and no per-column state is needed: row t+1 of `vs`
// is the recursion's carry.
#include "kernels/vtrace.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace zrl {
namespace {

// exp(x) for float, written so that GCC and Clang vectorise a loop over it
// (std::exp is an opaque libm call). Cephes' expf: range reduction by ln 2 in
// two parts, a degree-6 polynomial, and 2^n built in the exponent bits.
// Relative error below 2e-7 on [-87, 88]; inputs are clamped to that range,
// so exp(-inf) gives ~1e-38 rather than 0 (harmless: ratios are clipped or
// multiplied, never divided by).
inline float fast_expf(float x) {
  x = x > 88.0f ? 88.0f : x;
  x = x < -87.0f ? -87.0f : x;
  // n = round(x / ln 2) without a branch: adding 1.5 * 2^23 leaves the rounded
  // integer in the low mantissa bits.
  const float magic = 12582912.0f;
  const float shifted = x * 1.44269504088896341f + magic;
  const float fn = shifted - magic;
  uint32_t n_bits;  // (unsigned: a NaN's bits give a meaningless n, but no signed overflow)
  std::memcpy(&n_bits, &shifted, sizeof(n_bits));
  const uint32_t n = n_bits - 0x4B400000u;  // the bit pattern of `magic`: n as two's complement
  x = x - fn * 0.693359375f + fn * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * x * x + x + 1.0f;
  const uint32_t bits = (n + 127u) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

// The scan over one row t, split out so that every pointer can be declared
// non-aliasing (row t and row t+1 of `vs` are disjoint) and the loop vectorises.
inline void scan_row(const float* __restrict__ r_t, const float* __restrict__ d_t,
                     const float* __restrict__ v_t, const float* __restrict__ v_tp1,
                     const float* __restrict__ vs_tp1, float* __restrict__ vs_t,
                     float* __restrict__ pg_t, std::size_t B, float rho_bar,
                     float pg_rho_bar, float c_bar, float lambda) {
  for (std::size_t b = 0; b < B; ++b) {
    const float ratio = pg_t[b];
    const float clipped_rho = std::min(rho_bar, ratio);
    const float c = lambda * std::min(c_bar, ratio);
    const float delta = clipped_rho * (r_t[b] + d_t[b] * v_tp1[b] - v_t[b]);
    vs_t[b] = v_t[b] + delta + d_t[b] * c * (vs_tp1[b] - v_tp1[b]);
    pg_t[b] = std::min(pg_rho_bar, ratio) * (r_t[b] + d_t[b] * vs_tp1[b] - v_t[b]);
  }
}

inline void exp_all(const float* __restrict__ x, float* __restrict__ y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = fast_expf(x[i]);
}

}  // namespace

void vtrace_from_importance_weights(const float* log_rhos, const float* discounts,
                                    const float* rewards, const float* values,
                                    const float* bootstrap_value, std::size_t T,
                                    std::size_t B, const VTraceParams& params,
                                    float* vs, float* pg_advantages) {
  if (T == 0 || B == 0) throw std::invalid_argument("vtrace: T and B must be positive");
  if (!(params.clip_rho_threshold > 0.0f) || !(params.clip_pg_rho_threshold > 0.0f) ||
      !(params.clip_c_threshold > 0.0f))
    throw std::invalid_argument("vtrace: clipping thresholds must be > 0");
  if (!(params.lambda >= 0.0f && params.lambda <= 1.0f))
    throw std::invalid_argument("vtrace: lambda must be in [0, 1]");

  float* rho = pg_advantages;  // scratch until the scan overwrites row t
  exp_all(log_rhos, rho, T * B);

  for (std::size_t t = T; t-- > 0;) {
    const std::size_t row = t * B;
    // V(x_{t+1}) and vs_{t+1}: both the bootstrap value past the last step.
    const float* v_tp1 = (t + 1 < T) ? values + row + B : bootstrap_value;
    const float* vs_tp1 = (t + 1 < T) ? vs + row + B : bootstrap_value;
    scan_row(rewards + row, discounts + row, values + row, v_tp1, vs_tp1, vs + row,
             pg_advantages + row, B, params.clip_rho_threshold, params.clip_pg_rho_threshold,
             params.clip_c_threshold, params.lambda);
  }
}

}  // namespace zrl
