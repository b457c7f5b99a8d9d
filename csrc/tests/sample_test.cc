// GoogleTest of the categorical sampler against its definition (inverse CDF of the softmax).
#include "kernels/sample.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

TEST(SampleCategorical, InverseCdfAndLogProb) {
  // p = softmax(log(0.1, 0.2, 0.3, 0.4) + 5): cumulative 0.1, 0.3, 0.6, 1.0.
  const std::vector<float> row = {std::log(0.1f) + 5, std::log(0.2f) + 5, std::log(0.3f) + 5, std::log(0.4f) + 5};
  const std::vector<double> u = {0.0, 0.05, 0.1001, 0.29, 0.31, 0.59, 0.61, 0.999999};
  const std::vector<std::int64_t> want = {0, 0, 1, 1, 2, 2, 3, 3};
  const std::vector<float> p = {0.1f, 0.2f, 0.3f, 0.4f};
  std::vector<float> logits;
  for (std::size_t i = 0; i < u.size(); ++i) logits.insert(logits.end(), row.begin(), row.end());
  std::vector<std::int64_t> actions(u.size(), -1);
  std::vector<float> logp(u.size(), 0.0f);
  ASSERT_EQ(zrl::sample_categorical(logits.data(), u.size(), 4, u.data(), actions.data(), logp.data()), u.size());
  for (std::size_t i = 0; i < u.size(); ++i) {
    EXPECT_EQ(actions[i], want[i]) << "u=" << u[i];
    EXPECT_NEAR(logp[i], std::log(p[want[i]]), 1e-5) << "u=" << u[i];
  }
}

TEST(SampleCategorical, NeverPicksAnImpossibleAction) {
  const float inf = std::numeric_limits<float>::infinity();
  // Only action 1 is possible; u near 1 must not run past it to the -inf actions after it.
  const std::vector<float> logits = {-inf, 3.0f, -inf, -inf};
  for (double u : {0.0, 0.5, 0.9999999999}) {
    std::int64_t a = -1;
    float lp = 1.0f;
    ASSERT_EQ(zrl::sample_categorical(logits.data(), 1, 4, &u, &a, &lp), 1u);
    EXPECT_EQ(a, 1);
    EXPECT_FLOAT_EQ(lp, 0.0f);
  }
}

TEST(SampleCategorical, LargeLogitsDoNotOverflow) {
  const std::vector<float> logits = {1000.0f, 1000.0f};
  const double u[2] = {0.25, 0.75};
  const std::vector<float> two = {logits[0], logits[1], logits[0], logits[1]};
  std::int64_t a[2];
  float lp[2];
  ASSERT_EQ(zrl::sample_categorical(two.data(), 2, 2, u, a, lp), 2u);
  EXPECT_EQ(a[0], 0);
  EXPECT_EQ(a[1], 1);
  EXPECT_NEAR(lp[0], std::log(0.5f), 1e-6);
}

TEST(SampleCategorical, ReportsTheFirstBadRow) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const double u[3] = {0.5, 0.5, 0.5};
  std::int64_t a[3];
  float lp[3];
  const std::vector<float> with_nan = {0.0f, 1.0f, 0.0f, nan, 0.0f, 0.0f};
  EXPECT_EQ(zrl::sample_categorical(with_nan.data(), 3, 2, u, a, lp), 1u);
  const std::vector<float> with_inf = {0.0f, 1.0f, 0.0f, 0.0f, inf, 0.0f};
  EXPECT_EQ(zrl::sample_categorical(with_inf.data(), 3, 2, u, a, lp), 2u);
  const std::vector<float> all_masked = {-inf, -inf, 0.0f, 0.0f, 0.0f, 0.0f};
  EXPECT_EQ(zrl::sample_categorical(all_masked.data(), 3, 2, u, a, lp), 0u);
}

TEST(SampleCategorical, FindsTheFirstDrawOutsideTheUnitInterval) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> fine = {0.0, 0.5, std::nextafter(1.0, 0.0)};
  EXPECT_EQ(zrl::first_draw_outside_unit(fine.data(), fine.size()), fine.size());
  EXPECT_EQ(zrl::first_draw_outside_unit(nullptr, 0), 0u);
  const std::vector<double> one = {0.5, 1.0, -0.1};
  EXPECT_EQ(zrl::first_draw_outside_unit(one.data(), one.size()), 1u);
  const std::vector<double> negative = {-0.0, -1e-300};
  EXPECT_EQ(zrl::first_draw_outside_unit(negative.data(), negative.size()), 1u);
  const std::vector<double> with_nan = {0.1, 0.2, nan};
  EXPECT_EQ(zrl::first_draw_outside_unit(with_nan.data(), with_nan.size()), 2u);
}

}  // namespace
