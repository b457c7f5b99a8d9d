// GoogleTest of the V-trace kernel against a reference written as the paper's
// sum of products: vs_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t.
#include "kernels/vtrace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

namespace {

struct Reference {
  std::vector<double> vs, pg;
};

Reference reference_vtrace(const std::vector<float>& log_rhos, const std::vector<float>& disc,
                           const std::vector<float>& rew, const std::vector<float>& val,
                           const std::vector<float>& boot, std::size_t T, std::size_t B,
                           const zrl::VTraceParams& p) {
  Reference out{std::vector<double>(T * B), std::vector<double>(T * B)};
  auto at = [B](std::size_t t, std::size_t b) { return t * B + b; };
  for (std::size_t b = 0; b < B; ++b) {
    auto value = [&](std::size_t t) -> double { return t < T ? val[at(t, b)] : boot[b]; };
    for (std::size_t s = 0; s < T; ++s) {
      double sum = 0.0;
      for (std::size_t t = s; t < T; ++t) {
        double prod = 1.0;  // prod_{i=s}^{t-1} gamma_i c_i
        for (std::size_t i = s; i < t; ++i) {
          const double ratio = std::exp(double(log_rhos[at(i, b)]));
          prod *= disc[at(i, b)] * p.lambda * std::min(double(p.clip_c_threshold), ratio);
        }
        const double ratio_t = std::exp(double(log_rhos[at(t, b)]));
        const double delta = std::min(double(p.clip_rho_threshold), ratio_t) *
                             (rew[at(t, b)] + disc[at(t, b)] * value(t + 1) - value(t));
        sum += prod * delta;
      }
      out.vs[at(s, b)] = value(s) + sum;
    }
    for (std::size_t s = 0; s < T; ++s) {
      const double vs_next = s + 1 < T ? out.vs[at(s + 1, b)] : boot[b];
      const double ratio = std::exp(double(log_rhos[at(s, b)]));
      out.pg[at(s, b)] = std::min(double(p.clip_pg_rho_threshold), ratio) *
                         (rew[at(s, b)] + disc[at(s, b)] * vs_next - value(s));
    }
  }
  return out;
}

void check_against_reference(std::size_t T, std::size_t B, const zrl::VTraceParams& p,
                             unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> log_rhos(T * B), disc(T * B), rew(T * B), val(T * B), boot(B);
  for (std::size_t i = 0; i < T * B; ++i) {
    log_rhos[i] = normal(rng);  // ratios on both sides of every threshold
    disc[i] = uniform(rng) < 0.1f ? 0.0f : 0.99f;  // terminations inside the trajectory
    rew[i] = normal(rng);
    val[i] = normal(rng);
  }
  for (auto& x : boot) x = normal(rng);
  std::vector<float> vs(T * B), pg(T * B);
  zrl::vtrace_from_importance_weights(log_rhos.data(), disc.data(), rew.data(), val.data(),
                                      boot.data(), T, B, p, vs.data(), pg.data());
  Reference ref = reference_vtrace(log_rhos, disc, rew, val, boot, T, B, p);
  for (std::size_t i = 0; i < T * B; ++i) {
    EXPECT_NEAR(vs[i], ref.vs[i], 1e-4 * (1.0 + std::abs(ref.vs[i]))) << "vs at " << i;
    EXPECT_NEAR(pg[i], ref.pg[i], 1e-4 * (1.0 + std::abs(ref.pg[i]))) << "pg at " << i;
  }
}

TEST(VTrace, MatchesReferenceWithDefaultClipping) {
  check_against_reference(20, 7, zrl::VTraceParams{}, 1);
}

TEST(VTrace, MatchesReferenceWithDistinctThresholdsAndLambda) {
  check_against_reference(13, 5, zrl::VTraceParams{1.5f, 0.7f, 0.9f, 0.8f}, 2);
}

TEST(VTrace, MatchesReferenceWithoutClipping) {
  const float inf = std::numeric_limits<float>::infinity();
  check_against_reference(9, 3, zrl::VTraceParams{inf, inf, inf, 1.0f}, 3);
}

TEST(VTrace, SingleStepAndSingleColumn) {
  check_against_reference(1, 1, zrl::VTraceParams{}, 4);
  check_against_reference(1, 6, zrl::VTraceParams{}, 5);
  check_against_reference(17, 1, zrl::VTraceParams{}, 6);
}

TEST(VTrace, OnPolicyIsTheDiscountedReturnWithBootstrap) {
  // With pi == mu and lambda = 1, vs_s is the n-step return bootstrapped from the end.
  const std::size_t T = 3, B = 1;
  std::vector<float> log_rhos(T, 0.0f), disc(T, 0.5f), rew{1.0f, 2.0f, 3.0f},
      val{10.0f, 20.0f, 30.0f}, boot{4.0f}, vs(T), pg(T);
  zrl::vtrace_from_importance_weights(log_rhos.data(), disc.data(), rew.data(), val.data(),
                                      boot.data(), T, B, zrl::VTraceParams{}, vs.data(),
                                      pg.data());
  EXPECT_FLOAT_EQ(vs[2], 3.0f + 0.5f * 4.0f);
  EXPECT_FLOAT_EQ(vs[1], 2.0f + 0.5f * vs[2]);
  EXPECT_FLOAT_EQ(vs[0], 1.0f + 0.5f * vs[1]);
  EXPECT_FLOAT_EQ(pg[0], 1.0f + 0.5f * vs[1] - 10.0f);
}

TEST(VTrace, RejectsEmptyAndBadParameters) {
  float x = 0.0f;
  EXPECT_THROW(zrl::vtrace_from_importance_weights(&x, &x, &x, &x, &x, 0, 1, {}, &x, &x),
               std::invalid_argument);
  zrl::VTraceParams bad;
  bad.lambda = 1.5f;
  float out[2];
  EXPECT_THROW(zrl::vtrace_from_importance_weights(&x, &x, &x, &x, &x, 1, 1, bad, out, out + 1),
               std::invalid_argument);
  bad = {};
  bad.clip_c_threshold = 0.0f;
  EXPECT_THROW(zrl::vtrace_from_importance_weights(&x, &x, &x, &x, &x, 1, 1, bad, out, out + 1),
               std::invalid_argument);
}

}  // namespace
