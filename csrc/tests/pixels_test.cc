// GoogleTest of the pixel relayout kernels against the definition, index by index.
#include "kernels/pixels.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace {

std::vector<std::uint8_t> random_pixels(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, 255);
  std::vector<std::uint8_t> v(count);
  for (auto& x : v) x = static_cast<std::uint8_t>(dist(rng));
  return v;
}

float from_bf16(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

class PixelsTest : public ::testing::TestWithParam<std::size_t> {};

// Every channel count the kernel specialises (1 to 4) and one it does not (5).
TEST_P(PixelsTest, MatchesDefinition) {
  const std::size_t n = 3, c = GetParam(), h = 7, w = 5, hw = h * w;
  const auto src = random_pixels(n * c * hw, static_cast<unsigned>(c));
  std::vector<float> f32(n * hw * c, -1.0f);
  std::vector<std::uint16_t> bf16(n * hw * c, 0xffff);
  std::vector<std::uint8_t> u8(n * hw * c, 0);
  zrl::planes_to_channels_last(src.data(), n, c, hw, f32.data());
  zrl::planes_to_channels_last_bf16(src.data(), n, c, hw, bf16.data());
  zrl::planes_to_channels_last_u8(src.data(), n, c, hw, u8.data());
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t ch = 0; ch < c; ++ch)
      for (std::size_t p = 0; p < hw; ++p) {
        const float want = static_cast<float>(src[(i * c + ch) * hw + p]);
        const std::size_t at = (i * hw + p) * c + ch;
        ASSERT_EQ(f32[at], want) << "n=" << i << " c=" << ch << " p=" << p;
        ASSERT_EQ(from_bf16(bf16[at]), want) << "n=" << i << " c=" << ch << " p=" << p;
        ASSERT_EQ(u8[at], src[(i * c + ch) * hw + p]) << "n=" << i << " c=" << ch << " p=" << p;
      }
}

INSTANTIATE_TEST_SUITE_P(Channels, PixelsTest, ::testing::Values(1, 2, 3, 4, 5));

TEST(Pixels, EveryByteValueIsExactInBf16) {
  std::vector<std::uint8_t> src(256);
  for (int v = 0; v < 256; ++v) src[v] = static_cast<std::uint8_t>(v);
  std::vector<std::uint16_t> out(256);
  zrl::planes_to_channels_last_bf16(src.data(), 1, 1, 256, out.data());
  for (int v = 0; v < 256; ++v) EXPECT_EQ(from_bf16(out[v]), static_cast<float>(v)) << v;
}

TEST(Pixels, EmptyBatchWritesNothing) {
  std::vector<float> out(4, -1.0f);
  zrl::planes_to_channels_last(nullptr, 0, 4, 84 * 84, out.data());
  for (float x : out) EXPECT_EQ(x, -1.0f);
}

}  // namespace
