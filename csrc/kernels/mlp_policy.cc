#include "kernels/mlp_policy.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

namespace zrl {
namespace {

void check_dense(const Dense& d, std::size_t in, const std::string& name) {
  if (d.in != in || d.out == 0) {
    throw std::invalid_argument(name + ": expected " + std::to_string(in) + " inputs and >= 1 output, got " +
                                std::to_string(d.in) + " -> " + std::to_string(d.out));
  }
  if (d.weight.size() != d.in * d.out || d.bias.size() != d.out) {
    throw std::invalid_argument(name + ": weight must hold in * out values and bias out");
  }
}

// y[b, o] = bias[o] + sum_i w[o, i] x[b, i]: one dot product per output, contiguous in
// both operands, which the compiler vectorises; a 64x64 layer is a few hundred cycles a row.
void dense(const Dense& d, const float* x, std::size_t batch, float* y) {
  const std::size_t in = d.in, out = d.out;
  const float* w = d.weight.data();
  for (std::size_t b = 0; b < batch; ++b) {
    const float* xb = x + b * in;
    float* yb = y + b * out;
    for (std::size_t o = 0; o < out; ++o) {
      const float* wo = w + o * in;
      float acc = 0.0f;
      for (std::size_t i = 0; i < in; ++i) acc += wo[i] * xb[i];
      yb[o] = acc + d.bias[o];
    }
  }
}

void activate(Activation a, float* x, std::size_t n) {
  if (a == Activation::kTanh) {
    for (std::size_t i = 0; i < n; ++i) x[i] = std::tanh(x[i]);
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
  for (const Dense& d : torso_) {
    dense(d, x, batch, y);
    activate(activation_, y, batch * d.out);
    x = y;
    y = y == a_.data() ? b_.data() : a_.data();
  }
  dense(head_, x, batch, out);
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
