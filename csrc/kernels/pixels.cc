#include "kernels/pixels.h"

#include <cstring>

namespace zrl {
namespace {

struct ToFloat {
  using Out = float;
  static float convert(std::uint8_t v) { return static_cast<float>(v); }
};

struct ToBf16 {
  using Out = std::uint16_t;
  // float(v) has at most 8 significant bits, so truncating to the upper 16 bits is exact.
  static std::uint16_t convert(std::uint8_t v) {
    const float f = static_cast<float>(v);
    std::uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    return static_cast<std::uint16_t>(bits >> 16);
  }
};

struct ToU8 {
  using Out = std::uint8_t;
  static std::uint8_t convert(std::uint8_t v) { return v; }
};

// One image, its channel count known at compile time: the inner loop reads C
// planes side by side and writes each pixel's C values together.
// __restrict__: src is a char type, which may alias anything; without it the
// compiler has to assume each store to dst may change src.
template <class Conv, std::size_t C>
void image_fixed(const std::uint8_t* __restrict__ src, std::size_t hw,
                 typename Conv::Out* __restrict__ dst) {
  for (std::size_t p = 0; p < hw; ++p)
    for (std::size_t c = 0; c < C; ++c) dst[p * C + c] = Conv::convert(src[c * hw + p]);
}

template <class Conv>
void image_any(const std::uint8_t* __restrict__ src, std::size_t c_count, std::size_t hw,
               typename Conv::Out* __restrict__ dst) {
  for (std::size_t c = 0; c < c_count; ++c)
    for (std::size_t p = 0; p < hw; ++p) dst[p * c_count + c] = Conv::convert(src[c * hw + p]);
}

template <class Conv>
void convert(const std::uint8_t* src, std::size_t n, std::size_t c, std::size_t hw,
             typename Conv::Out* dst) {
  const std::size_t image = c * hw;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint8_t* s = src + i * image;
    typename Conv::Out* d = dst + i * image;
    switch (c) {
      case 1: image_fixed<Conv, 1>(s, hw, d); break;
      case 2: image_fixed<Conv, 2>(s, hw, d); break;
      case 3: image_fixed<Conv, 3>(s, hw, d); break;
      case 4: image_fixed<Conv, 4>(s, hw, d); break;
      default: image_any<Conv>(s, c, hw, d); break;
    }
  }
}

}  // namespace

void planes_to_channels_last(const std::uint8_t* src, std::size_t n, std::size_t c,
                             std::size_t hw, float* dst) {
  convert<ToFloat>(src, n, c, hw, dst);
}

void planes_to_channels_last_bf16(const std::uint8_t* src, std::size_t n, std::size_t c,
                                  std::size_t hw, std::uint16_t* dst) {
  convert<ToBf16>(src, n, c, hw, dst);
}

void planes_to_channels_last_u8(const std::uint8_t* src, std::size_t n, std::size_t c,
                                std::size_t hw, std::uint8_t* dst) {
  convert<ToU8>(src, n, c, hw, dst);
}

}  // namespace zrl
