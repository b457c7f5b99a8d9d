#include "kernels/mlp_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace zrl {
namespace {

Dense layer(std::size_t in, std::size_t out, std::vector<float> w, std::vector<float> b) {
  return Dense{in, out, std::move(w), std::move(b)};
}

TEST(MlpPolicy, ComputesLinearActivationAndHeadPerRow) {
  // 2 -> 2 (tanh) -> 1, worked by hand for two rows.
  MlpPolicy p(2, {layer(2, 2, {1, 0, 0.5f, -1}, {0, 0.25f})}, Activation::kTanh, layer(2, 1, {2, -1}, {0.5f}));
  const std::vector<float> obs = {1, 2, -1, 0};
  std::vector<float> out(2);
  p.forward(obs.data(), 2, out.data());
  for (int r = 0; r < 2; ++r) {
    const float x0 = obs[2 * r], x1 = obs[2 * r + 1];
    const float h0 = std::tanh(x0), h1 = std::tanh(0.5f * x0 - x1 + 0.25f);
    EXPECT_NEAR(out[r], 2 * h0 - h1 + 0.5f, 1e-6f);
  }
}

TEST(MlpPolicy, ReluAndNormaliserClip) {
  ObsNormalizer norm{{1.0f}, {4.0f}, 1.5f, 0.0f};
  MlpPolicy p(1, {layer(1, 1, {1}, {0})}, Activation::kRelu, layer(1, 1, {1}, {0}), norm);
  const std::vector<float> obs = {2.0f, 100.0f, -100.0f};
  std::vector<float> out(3);
  p.forward(obs.data(), 3, out.data());
  EXPECT_FLOAT_EQ(out[0], 0.5f);   // (2 - 1) / 2
  EXPECT_FLOAT_EQ(out[1], 1.5f);   // clipped
  EXPECT_FLOAT_EQ(out[2], 0.0f);   // clipped to -1.5, then relu
}

TEST(MlpPolicy, NoTorsoIsTheHeadAlone) {
  MlpPolicy p(2, {}, Activation::kTanh, layer(2, 3, {1, 0, 0, 1, 1, 1}, {0, 0, 1}));
  const std::vector<float> obs = {3, 4};
  std::vector<float> out(3);
  p.forward(obs.data(), 1, out.data());
  EXPECT_EQ(out, (std::vector<float>{3, 4, 8}));
}

TEST(MlpPolicy, RejectsShapesThatDoNotChain) {
  EXPECT_THROW(MlpPolicy(3, {layer(2, 2, {1, 0, 0, 1}, {0, 0})}, Activation::kTanh, layer(2, 1, {1, 1}, {0})),
               std::invalid_argument);
  EXPECT_THROW(MlpPolicy(2, {}, Activation::kTanh, layer(2, 1, {1}, {0})), std::invalid_argument);
  ObsNormalizer short_norm{{0.0f}, {1.0f}};
  EXPECT_THROW(MlpPolicy(2, {}, Activation::kTanh, layer(2, 1, {1, 1}, {0}), short_norm), std::invalid_argument);
}

TEST(SampleGaussian, ActionIsMeanPlusScaledNormalAndLogpIsTheDensity) {
  const std::vector<float> mean = {0.5f, -1.0f};
  const std::vector<float> log_std = {std::log(2.0f), 0.0f};
  const std::vector<double> normals = {1.0, -0.5};
  std::vector<float> action(2), logp(1);
  ASSERT_EQ(sample_gaussian(mean.data(), 1, 2, log_std.data(), normals.data(), action.data(), logp.data()), 1u);
  EXPECT_FLOAT_EQ(action[0], 2.5f);
  EXPECT_FLOAT_EQ(action[1], -1.5f);
  const double want = (-0.5 * 1.0 - std::log(2.0) - 0.5 * std::log(2 * M_PI)) + (-0.5 * 0.25 - 0.5 * std::log(2 * M_PI));
  EXPECT_NEAR(logp[0], want, 1e-5);
}

TEST(SampleGaussian, ReportsTheFirstRowThatIsNotFinite) {
  const std::vector<float> mean = {0.0f, NAN, 0.0f};
  const std::vector<float> log_std = {0.0f};
  const std::vector<double> normals = {0.0, 0.0, 0.0};
  std::vector<float> action(3), logp(3);
  EXPECT_EQ(sample_gaussian(mean.data(), 3, 1, log_std.data(), normals.data(), action.data(), logp.data()), 1u);
}

}  // namespace
}  // namespace zrl

namespace zrl {
namespace {

TEST(MlpPolicy, ItsTanhIsLibmsToAFewUlps) {
  // One unit, weight 1: the output is the activation of the input.
  MlpPolicy p(1, {Dense{1, 1, {1}, {0}}}, Activation::kTanh, Dense{1, 1, {1}, {0}});
  double worst = 0.0;
  for (float x = -12.0f; x <= 12.0f; x += 1e-3f) {
    float y = 0.0f;
    p.forward(&x, 1, &y);
    worst = std::max(worst, std::abs(static_cast<double>(y) - std::tanh(static_cast<double>(x))));
  }
  EXPECT_LT(worst, 5e-7);
}

}  // namespace
}  // namespace zrl
