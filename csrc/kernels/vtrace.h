// V-trace targets (Espeholt et al. 2018, "IMPALA", eq. 1 and section 4.2)
// over time-major [T, B] float32 buffers, row-major (index t * B + b).
//
// Conventions follow SEED RL:
//   rho_s  = min(rho_bar, pi/mu)          pi/mu = exp(log_rhos[s])
//   c_i    = lambda * min(c_bar, pi/mu)
//   vs_s   = V(x_s) + sum_{t>=s} gamma^{t-s}-products * (prod_{i=s}^{t-1} c_i) * delta_t
//   delta_t = rho_t * (r_t + gamma_t * V(x_{t+1}) - V(x_t))
//   pg_advantage_s = min(pg_rho_bar, pi/mu) * (r_s + gamma_s * vs_{s+1} - V(x_s))
// with V(x_T) = vs_T = bootstrap_value[b]. `discounts` already holds
// gamma * (1 - terminated), so episode ends inside the trajectory cut the sums.
//
// Pure function: no allocation beyond the caller's buffers, no globals, safe to
// call from any number of threads at once on distinct outputs.
#pragma once

#include <cstddef>

namespace zrl {

struct VTraceParams {
  // Thresholds are > 0; +infinity means no clipping.
  float clip_rho_threshold = 1.0f;     // rho bar
  float clip_pg_rho_threshold = 1.0f;  // rho bar of the policy-gradient advantage
  float clip_c_threshold = 1.0f;       // c bar
  float lambda = 1.0f;                 // trace-cutting lambda in [0, 1]
};

// Inputs: log_rhos, discounts, rewards, values are [T, B]; bootstrap_value is [B].
// Outputs: vs and pg_advantages are [T, B]; they must not alias the inputs.
// Throws std::invalid_argument when T or B is zero or a parameter is out of range.
void vtrace_from_importance_weights(const float* log_rhos, const float* discounts,
                                    const float* rewards, const float* values,
                                    const float* bootstrap_value, std::size_t T,
                                    std::size_t B, const VTraceParams& params,
                                    float* vs, float* pg_advantages);

}  // namespace zrl
