// GoogleTest of the int8 layer kernel (int8_gemm.h): a convolution and an FC against their
// definitions in plain integer loops, and the SIMD kernels against the portable one.
#include "kernels/int8_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace {

struct Case {
  std::vector<std::uint8_t> x;
  std::vector<std::int64_t> base;
  std::vector<std::int32_t> offs;
  std::vector<std::int8_t> w;  // [J][OC][4]: output oc's j-th run of 4 weights at (j * OC + oc) * 4
  std::vector<float> scale, bias;
  std::size_t OC = 0;
  // The layer, its weights laid out in blocks of 16 outputs as the kernel reads them.
  zrl::Int8Layer layer() {
    const std::size_t J = offs.size();
    blocks.assign(w.size(), 0);
    for (std::size_t j = 0; j < J; ++j)
      for (std::size_t oc = 0; oc < OC; ++oc)
        for (std::size_t q = 0; q < 4; ++q) blocks[((oc / 16) * J + j) * 64 + (oc % 16) * 4 + q] = w[(j * OC + oc) * 4 + q];
    return {blocks.data(), J, OC, offs.data(), scale.data(), bias.data()};
  }
  std::vector<std::int8_t> blocks;  // [OC / 16][J][16][4], made by layer()
};

// An FC on P rows of K bytes: base p * K, runs 4 j; weights and inputs in the range the kernel
// takes (x <= 127 with |w| <= 127, x <= 255 with |w| <= 63).
Case fc_case(std::size_t P, std::size_t K, std::size_t OC, int xmax, int wmax, std::mt19937& rng) {
  Case c;
  c.OC = OC;
  std::uniform_int_distribution<int> xd(0, xmax), wd(-wmax, wmax);
  std::uniform_real_distribution<float> sd(0.001f, 0.01f), bd(-1.0f, 1.0f);
  c.x.resize(P * K);
  for (auto& v : c.x) v = static_cast<std::uint8_t>(xd(rng));
  for (std::size_t p = 0; p < P; ++p) c.base.push_back(static_cast<std::int64_t>(p * K));
  for (std::size_t j = 0; j < K / 4; ++j) c.offs.push_back(static_cast<std::int32_t>(4 * j));
  c.w.resize(K * OC);
  for (auto& v : c.w) v = static_cast<std::int8_t>(wd(rng));
  for (std::size_t o = 0; o < OC; ++o) {
    c.scale.push_back(sd(rng));
    c.bias.push_back(bd(rng));
  }
  return c;
}

// The kernels this CPU runs: each test holds every one of them to the definition.
std::vector<zrl::Int8Kernel> kernels_here() {
  std::vector<zrl::Int8Kernel> out;
  for (auto k : {zrl::Int8Kernel::kAvx512Vnni, zrl::Int8Kernel::kAvx2, zrl::Int8Kernel::kPortable})
    if (zrl::int8_kernel_runs(k)) out.push_back(k);
  return out;
}

std::int64_t dot(const Case& c, std::size_t p, std::size_t oc) {
  std::int64_t acc = 0;
  for (std::size_t j = 0; j < c.offs.size(); ++j)
    for (std::size_t q = 0; q < 4; ++q)
      acc += static_cast<std::int64_t>(c.x[c.base[p] + c.offs[j] + q]) * c.w[(j * c.OC + oc) * 4 + q];
  return acc;
}

TEST(Int8Layer, FloatOutputsAreTheExactSumsScaledWithTheReLU) {
  for (zrl::Int8Kernel k : kernels_here()) {
    SCOPED_TRACE(zrl::int8_kernel_name(k));
    std::mt19937 rng(1);
    for (int xmax : {127, 255}) {
      for (std::size_t P : {7, 13}) {  // short last tiles (of 4 and of 8 positions)
        Case c = fc_case(P, 96, 32, xmax, xmax == 255 ? 63 : 127, rng);
        for (auto& s : c.scale) s = 1.0f;
        for (auto& b : c.bias) b = 1 << 20;  // positive, and every sum exact in float32
        std::vector<float> out(P * 32);
        ASSERT_TRUE(zrl::int8_layer(c.x.data(), c.base.data(), P, c.layer(), 1.0f, 0, nullptr, out.data(), k));
        for (std::size_t p = 0; p < P; ++p)
          for (std::size_t o = 0; o < 32; ++o)
            ASSERT_EQ(out[p * 32 + o], static_cast<float>(dot(c, p, o) + (1 << 20))) << p << " " << o;
        for (auto& b : c.bias) b = -(1 << 20);  // every output below zero: the ReLU
        ASSERT_TRUE(zrl::int8_layer(c.x.data(), c.base.data(), P, c.layer(), 1.0f, 0, nullptr, out.data(), k));
        for (float v : out) ASSERT_EQ(v, 0.0f);
      }
    }
  }
}

TEST(Int8Layer, Uint8OutputsRoundHalfToEvenAndClamp) {
  for (zrl::Int8Kernel k : kernels_here()) {
    SCOPED_TRACE(zrl::int8_kernel_name(k));
    std::mt19937 rng(2);
    Case c = fc_case(13, 256, 48, 255, 63, rng);
    std::vector<std::uint8_t> out(13 * 48);
    const float inv = 0.5f;
    ASSERT_TRUE(zrl::int8_layer(c.x.data(), c.base.data(), 13, c.layer(), inv, 200, out.data(), nullptr, k));
    int clamped_low = 0, clamped_high = 0;
    for (std::size_t p = 0; p < 13; ++p)
      for (std::size_t o = 0; o < 48; ++o) {
        const float y = std::fma(static_cast<float>(dot(c, p, o)), c.scale[o], c.bias[o]);
        const float want = std::fmin(std::fmax(std::nearbyint(y * inv), 0.0f), 200.0f);
        ASSERT_EQ(out[p * 48 + o], static_cast<std::uint8_t>(want)) << p << " " << o << " y " << y;
        clamped_low += want == 0.0f;
        clamped_high += want == 200.0f;
      }
    EXPECT_GT(clamped_low, 0);
    EXPECT_GT(clamped_high, 0);
    // Ties go to even: y * inv = 2.5 -> 2 and 3.5 -> 4.
    Case t = fc_case(1, 4, 16, 0, 0, rng);
    for (std::size_t o = 0; o < 16; ++o) t.bias[o] = (o % 2 ? 7.0f : 5.0f);
    std::vector<std::uint8_t> ties(16);
    ASSERT_TRUE(zrl::int8_layer(t.x.data(), t.base.data(), 1, t.layer(), 0.5f, 255, ties.data(), nullptr, k));
    for (std::size_t o = 0; o < 16; ++o) EXPECT_EQ(ties[o], o % 2 ? 4 : 2);
  }
}

TEST(Int8Layer, AutoPicksTheFastestKernelThisCpuRuns) {
  const auto here = kernels_here();
  ASSERT_FALSE(here.empty());
  EXPECT_EQ(here.back(), zrl::Int8Kernel::kPortable);  // runs everywhere
  EXPECT_STREQ(zrl::int8_kernel_name(zrl::Int8Kernel::kAuto), zrl::int8_kernel_name(here.front()));
  if (!zrl::int8_kernel_runs(zrl::Int8Kernel::kAvx512Vnni)) {
    Case c;
    c.OC = 16;
    c.x.assign(4, 0);
    c.base = {0};
    c.offs = {0};
    c.w.assign(64, 0);
    c.scale.assign(16, 1.0f);
    c.bias.assign(16, 0.0f);
    std::vector<float> out(16, -1.0f);
    EXPECT_FALSE(zrl::int8_layer(c.x.data(), c.base.data(), 1, c.layer(), 1.0f, 0, nullptr, out.data(), zrl::Int8Kernel::kAvx512Vnni));
    EXPECT_EQ(out[0], -1.0f);  // nothing written
  }
}

// The AVX-512 VNNI kernel sums 4 products straight into int32: with weights of the whole
// int8 range and bright inputs (pairs of products past int16) it still gives the exact sums.
TEST(Int8Layer, TheVnniKernelIsExactForTheWholeInt8Range) {
  const auto k = zrl::Int8Kernel::kAvx512Vnni;
  if (!zrl::int8_kernel_runs(k)) GTEST_SKIP() << "needs a CPU with AVX-512 VNNI";
  std::mt19937 rng(4);
  for (std::size_t P : {1, 8, 13, 17}) {  // tiles of 8: none short, one, and short ones
    Case c = fc_case(P, 128, 48, 255, 127, rng);
    for (std::size_t i = 0; i < 8 && i < c.x.size(); ++i) c.x[i] = 255;  // a run at the extremes
    for (std::size_t i = 0; i < 8; ++i) c.w[i] = static_cast<std::int8_t>(i % 2 ? -128 : 127);
    for (auto& v : c.scale) v = 1.0f;
    for (auto& v : c.bias) v = 1 << 23;  // |acc| <= 128 x 255 x 128 < 2^23: positive and exact in float32
    std::vector<float> out(P * 48);
    ASSERT_TRUE(zrl::int8_layer(c.x.data(), c.base.data(), P, c.layer(), 1.0f, 0, nullptr, out.data(), k));
    for (std::size_t p = 0; p < P; ++p)
      for (std::size_t o = 0; o < 48; ++o)
        ASSERT_EQ(out[p * 48 + o], static_cast<float>(dot(c, p, o) + (1 << 23))) << P << ": " << p << " " << o;
    std::vector<std::uint8_t> u8(P * 48), u8_portable(P * 48);
    for (auto& v : c.scale) v = 0.001f;
    for (auto& v : c.bias) v = 40.0f;
    ASSERT_TRUE(zrl::int8_layer(c.x.data(), c.base.data(), P, c.layer(), 0.5f, 255, u8.data(), nullptr, k));
    ASSERT_TRUE(zrl::int8_layer(c.x.data(), c.base.data(), P, c.layer(), 0.5f, 255, u8_portable.data(), nullptr,
                                zrl::Int8Kernel::kPortable));
    EXPECT_EQ(u8, u8_portable) << P;
  }
}

TEST(Int8Layer, AConvolutionOverNchwPixelsIsItsDefinition) {
  // N=2, C=3, 11x13 pixels, kernel 4x8 stride (2, 3): runs of 4 along the kernel's width.
  std::mt19937 rng(3);
  const int N = 2, C = 3, H = 11, W = 13, KH = 4, KW = 8, SH = 2, SW = 3, OC = 16;
  const int OH = (H - KH) / SH + 1, OW = (W - KW) / SW + 1;
  std::uniform_int_distribution<int> xd(0, 255), wd(-63, 63);
  std::vector<std::uint8_t> x(N * C * H * W);
  for (auto& v : x) v = static_cast<std::uint8_t>(xd(rng));
  std::vector<int> kernel(OC * C * KH * KW);  // [OC][C][KH][KW]
  for (auto& v : kernel) v = wd(rng);
  Case c;
  c.OC = OC;
  c.x = x;
  for (int ic = 0; ic < C; ++ic)
    for (int ky = 0; ky < KH; ++ky)
      for (int kx = 0; kx < KW; kx += 4) c.offs.push_back(ic * H * W + ky * W + kx);
  c.w.resize(c.offs.size() * OC * 4);
  std::size_t j = 0;
  for (int ic = 0; ic < C; ++ic)
    for (int ky = 0; ky < KH; ++ky)
      for (int kx = 0; kx < KW; kx += 4, ++j)
        for (int o = 0; o < OC; ++o)
          for (int q = 0; q < 4; ++q) c.w[(j * OC + o) * 4 + q] = static_cast<std::int8_t>(kernel[((o * C + ic) * KH + ky) * KW + kx + q]);
  for (int n = 0; n < N; ++n)
    for (int oy = 0; oy < OH; ++oy)
      for (int ox = 0; ox < OW; ++ox) c.base.push_back(n * C * H * W + oy * SH * W + ox * SW);
  c.scale.assign(OC, 1.0f);
  c.bias.assign(OC, 1 << 21);
  for (zrl::Int8Kernel k : kernels_here()) {
    SCOPED_TRACE(zrl::int8_kernel_name(k));
    std::vector<float> out(c.base.size() * OC);
    ASSERT_TRUE(zrl::int8_layer(c.x.data(), c.base.data(), c.base.size(), c.layer(), 1.0f, 0, nullptr, out.data(), k));
    for (int n = 0; n < N; ++n)
      for (int oy = 0; oy < OH; ++oy)
        for (int ox = 0; ox < OW; ++ox)
          for (int o = 0; o < OC; ++o) {
            std::int64_t acc = 0;
            for (int ic = 0; ic < C; ++ic)
              for (int ky = 0; ky < KH; ++ky)
                for (int kx = 0; kx < KW; ++kx)
                  acc += x[((n * C + ic) * H + oy * SH + ky) * W + ox * SW + kx] * kernel[((o * C + ic) * KH + ky) * KW + kx];
            ASSERT_EQ(out[((n * OH + oy) * OW + ox) * OC + o], static_cast<float>(acc + (1 << 21)));
          }
  }
}

TEST(Int8Layer, RefusesAWidthThatIsNotAMultipleOf16) {
  std::mt19937 rng(4);
  Case c = fc_case(2, 8, 16, 10, 10, rng);
  c.OC = 8;  // as if the weights were [J][8][4]
  for (zrl::Int8Kernel k : kernels_here()) {
    std::vector<float> out(16, -1.0f);
    EXPECT_FALSE(zrl::int8_layer(c.x.data(), c.base.data(), 2, c.layer(), 1.0f, 0, nullptr, out.data(), k));
    for (float v : out) EXPECT_EQ(v, -1.0f);
  }
}

TEST(Int8Layer, RunsInsideXAreCheckedOverEveryBaseAndOffset) {
  const std::vector<std::int64_t> base = {8, 0, 4};
  const std::vector<std::int32_t> offs = {0, 2, 6};
  // The last run starts at 8 + 6 and ends at 18.
  EXPECT_TRUE(zrl::int8_runs_inside(base.data(), 3, offs.data(), 3, 18));
  EXPECT_FALSE(zrl::int8_runs_inside(base.data(), 3, offs.data(), 3, 17));
  const std::vector<std::int32_t> back = {-1, 0};
  EXPECT_FALSE(zrl::int8_runs_inside(base.data(), 3, back.data(), 2, 100));  // base 0 - 1 < 0
  // A base near INT64_MAX must not wrap around (past int64) into range.
  const std::vector<std::int64_t> huge = {INT64_MAX - 1};
  EXPECT_FALSE(zrl::int8_runs_inside(huge.data(), 1, offs.data(), 3, 100));
  EXPECT_TRUE(zrl::int8_runs_inside(nullptr, 0, offs.data(), 3, 0));  // no positions: no runs
  EXPECT_TRUE(zrl::int8_runs_inside(base.data(), 3, nullptr, 0, 0));
}

TEST(Int8Layer, TheLongestJKeepsEveryExactSumInsideInt32) {
  const std::int64_t worst = 4 * 255 * 127;  // the largest |sum| one run adds
  EXPECT_LE(static_cast<std::int64_t>(zrl::kInt8LayerMaxJ) * worst, INT32_MAX);
  EXPECT_GT(static_cast<std::int64_t>(zrl::kInt8LayerMaxJ + 1) * worst, INT32_MAX);
}

}  // namespace
