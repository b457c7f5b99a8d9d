// GoogleTest of the per-row int8 quantization against its definition (quantize.h).
#include "kernels/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

std::uint16_t to_bf16(float f) {  // truncation: the test only needs some bf16 values
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<std::uint16_t>(bits >> 16);
}

float from_bf16(std::uint16_t b) {
  const std::uint32_t wide = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

// The definition, element by element, with the C library's round-half-even.
void reference(const std::vector<float>& src, std::size_t rows, std::size_t k,
               std::vector<std::int8_t>& out, std::vector<float>& scales) {
  for (std::size_t r = 0; r < rows; ++r) {
    float top = 0.0f;
    for (std::size_t i = 0; i < k; ++i) top = std::fmax(top, std::fabs(src[r * k + i]));
    const float scale = std::fmax(top / 127.0f, 1e-12f);
    scales[r] = scale;
    for (std::size_t i = 0; i < k; ++i) {
      const float q = std::nearbyint(src[r * k + i] / scale);
      out[r * k + i] = static_cast<std::int8_t>(std::fmin(std::fmax(q, -127.0f), 127.0f));
    }
  }
}

TEST(QuantizeRows, MatchesDefinition) {
  // 37 values a row: the vector loops' tails are exercised too.
  const std::size_t rows = 5, k = 37;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 0.3f);
  std::vector<float> src(rows * k);
  for (auto& v : src) v = dist(rng);
  for (std::size_t i = 0; i < k; ++i) src[2 * k + i] = 0.0f;  // an all-zero row: the scale floor
  src[3 * k + 5] = -4.0f;  // a row whose largest magnitude is negative
  std::vector<std::int8_t> got(rows * k, 99), want(rows * k, 0);
  std::vector<float> got_s(rows, -1.0f), want_s(rows, 0.0f);
  ASSERT_TRUE(zrl::quantize_rows_int8(src.data(), rows, k, got.data(), got_s.data()));
  reference(src, rows, k, want, want_s);
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_s, want_s);
  EXPECT_FLOAT_EQ(got_s[2], 1e-12f);
  // Each row's largest magnitude maps to +-127.
  for (std::size_t r = 0; r < rows; ++r) {
    if (r == 2) continue;
    int top = 0;
    for (std::size_t i = 0; i < k; ++i) top = std::max(top, std::abs(static_cast<int>(got[r * k + i])));
    EXPECT_EQ(top, 127) << "row " << r;
  }
}

TEST(QuantizeRows, RoundsHalfToEven) {
  // Row max 127 -> scale 1: values are rounded as they are.
  const std::vector<float> src = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 3.49f};
  std::vector<std::int8_t> out(src.size());
  float scale = 0.0f;
  ASSERT_TRUE(zrl::quantize_rows_int8(src.data(), 1, src.size(), out.data(), &scale));
  EXPECT_FLOAT_EQ(scale, 1.0f);
  EXPECT_EQ(out, (std::vector<std::int8_t>{127, 0, 2, 2, 0, -2, -2, 3}));
}

TEST(QuantizeRows, Bf16MatchesFloatOfTheSameValues) {
  const std::size_t rows = 4, k = 19;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<std::uint16_t> bits(rows * k);
  std::vector<float> values(rows * k);
  for (std::size_t i = 0; i < bits.size(); ++i) {
    bits[i] = to_bf16(dist(rng));
    values[i] = from_bf16(bits[i]);
  }
  std::vector<std::int8_t> a(rows * k), b(rows * k);
  std::vector<float> sa(rows), sb(rows);
  ASSERT_TRUE(zrl::quantize_rows_int8_bf16(bits.data(), rows, k, a.data(), sa.data()));
  ASSERT_TRUE(zrl::quantize_rows_int8(values.data(), rows, k, b.data(), sb.data()));
  EXPECT_EQ(a, b);
  EXPECT_EQ(sa, sb);
}

TEST(QuantizeRows, RefusesNonFiniteWeights) {
  std::vector<float> src(2 * 6, 0.25f);
  std::vector<std::int8_t> out(src.size());
  std::vector<float> scales(2);
  src[8] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(zrl::quantize_rows_int8(src.data(), 2, 6, out.data(), scales.data()));
  src[8] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(zrl::quantize_rows_int8(src.data(), 2, 6, out.data(), scales.data()));
  src[8] = 0.5f;
  EXPECT_TRUE(zrl::quantize_rows_int8(src.data(), 2, 6, out.data(), scales.data()));
}

}  // namespace
