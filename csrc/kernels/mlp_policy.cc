#include "kernels/mlp_policy.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

namespace zrl {
namespace {

// The layers' loops built twice on x86-64 with GCC, for AVX2 and for the baseline (SSE2),
// and picked when the library loads (as quantize.cc's).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ZRL_MLP_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define ZRL_MLP_CLONES
#endif

void check_dense(const Dense& d, std::size_t in, const std::string& name) {
  if (d.in != in || d.out == 0) {
    throw std::invalid_argument(name + ": expected " + std::to_string(in) + " inputs and >= 1 output, got " +
                                std::to_string(d.in) + " -> " + std::to_string(d.out));
  }
  if (d.weight.size() != d.in * d.out || d.bias.size() != d.out) {
    throw std::invalid_argument(name + ": weight must hold in * out values and bias out");
  }
}

// y[b, :] = bias + sum_i x[b, i] * wt[i, :], with wt the weight transposed ([in, out]): the
// inner loop runs over outputs, contiguous and free of a dependency chain, so it vectorises
// without reassociating float sums (a dot product per output would be a serial chain of
// adds, several times slower for a 64x64 layer).
ZRL_MLP_CLONES void dense(const Dense& d, const std::vector<float>& wt, const float* x, std::size_t batch, float* y) {
  const std::size_t in = d.in, out = d.out;
  for (std::size_t b = 0; b < batch; ++b) {
    const float* xb = x + b * in;
    float* yb = y + b * out;
    std::copy(d.bias.begin(), d.bias.end(), yb);
    for (std::size_t i = 0; i < in; ++i) {
      const float xi = xb[i];
      const float* wi = wt.data() + i * out;
      for (std::size_t o = 0; o < out; ++o) yb[o] += xi * wi[o];
    }
  }
}

std::vector<float> transposed(const Dense& d) {
  std::vector<float> wt(d.in * d.out);
  for (std::size_t o = 0; o < d.out; ++o)
    for (std::size_t i = 0; i < d.in; ++i) wt[i * d.out + o] = d.weight[o * d.in + i];
  return wt;
}

// tanh as a rational function of degree 13/6 on [-9, 9] (beyond, float tanh is +-1): the
// minimax fit Eigen uses for float, within a few ulps of tanh. Unlike libm's tanhf, which
// costs ~40 ns a call, it vectorises: a 64-unit layer's activations in well under a
// microsecond instead of several.
inline float rational_tanh(float x) {
  x = std::min(std::max(x, -9.0f), 9.0f);
  const float x2 = x * x;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 - 8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  return x * p / q;
}

ZRL_MLP_CLONES void activate(Activation a, float* x, std::size_t n) {
  if (a == Activation::kTanh) {
    for (std::size_t i = 0; i < n; ++i) x[i] = rational_tanh(x[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
  }
}

}  // namespace

MlpPolicy::MlpPolicy(std::size_t obs_dim, std::vector<Dense> torso, Activation activation, Dense head,
                     ObsNormalizer norm)
    : obs_dim_(obs_dim), torso_(std::move(torso)), activation_(activation), head_(std::move(head)),
      norm_(std::move(norm)) {
  if (obs_dim_ == 0) throw std::invalid_argument("MlpPolicy: obs_dim must be >= 1");
  std::size_t in = obs_dim_;
  for (std::size_t k = 0; k < torso_.size(); ++k) {
    check_dense(torso_[k], in, "torso layer " + std::to_string(k));
    in = torso_[k].out;
  }
  check_dense(head_, in, "head");
  if (!norm_.mean.empty() && (norm_.mean.size() != obs_dim_ || norm_.var.size() != obs_dim_)) {
    throw std::invalid_argument("MlpPolicy: the normaliser's mean and var must hold obs_dim values");
  }
  for (const Dense& d : torso_) torso_t_.push_back(transposed(d));
  head_t_ = transposed(head_);
}

void MlpPolicy::forward(const float* obs, std::size_t batch, float* out) {
  std::size_t widest = obs_dim_;
  for (const Dense& d : torso_) widest = std::max(widest, d.out);
  if (a_.size() < batch * widest) {
    a_.resize(batch * widest);
    b_.resize(batch * widest);
  }
  const float* x = obs;
  if (!norm_.mean.empty()) {
    for (std::size_t b = 0; b < batch; ++b) {
      for (std::size_t i = 0; i < obs_dim_; ++i) {
        const float z = (obs[b * obs_dim_ + i] - norm_.mean[i]) / std::sqrt(norm_.var[i] + norm_.eps);
        a_[b * obs_dim_ + i] = std::min(std::max(z, -norm_.clip), norm_.clip);
      }
    }
    x = a_.data();
  }
  float* y = x == a_.data() ? b_.data() : a_.data();
  for (std::size_t k = 0; k < torso_.size(); ++k) {
    dense(torso_[k], torso_t_[k], x, batch, y);
    activate(activation_, y, batch * torso_[k].out);
    x = y;
    y = y == a_.data() ? b_.data() : a_.data();
  }
  dense(head_, head_t_, x, batch, out);
}

std::size_t sample_gaussian(const float* mean, std::size_t b, std::size_t a, const float* log_std,
                            const double* normals, float* actions, float* logp) {
  const float half_log_2pi = 0.5f * static_cast<float>(std::log(2.0 * M_PI));
  for (std::size_t i = 0; i < b; ++i) {
    float sum = 0.0f;
    bool finite = true;
    for (std::size_t j = 0; j < a; ++j) {
      const float std_j = std::exp(log_std[j]);
      const float m = mean[i * a + j];
      const float act = m + std_j * static_cast<float>(normals[i * a + j]);
      const float z = (act - m) / std_j;
      actions[i * a + j] = act;
      sum += -0.5f * z * z - log_std[j] - half_log_2pi;
      finite = finite && std::isfinite(act);
    }
    logp[i] = sum;
    if (!finite || !std::isfinite(sum)) return i;
  }
  return b;
}

}  // namespace zrl
