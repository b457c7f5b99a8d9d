// Image batches from the wire's layout to the one CPU convolutions run fastest on.
//
// Observations travel as uint8 [N, C, H, W] planes (C stacked frames, or colour
// planes). oneDNN's convolutions on the CPU run faster on [N, H, W, C] (PyTorch's
// channels_last memory format): IMPALA's shallow CNN acts 14% faster and trains
// 1.8x faster in fp32 (zrl/models/cnn.py has the figures). But PyTorch's own
// uint8 -> float cast followed by its relayout costs ~12 us per 4x84x84 frame,
// as much as the actor's policy saves. These kernels do both in one pass
// (~3-4 us per frame):
//   dst[(n * H * W + p) * C + c] = float(src[(n * C + c) * H * W + p]).
//
// bfloat16 output is written as its bits (the upper half of the float32);
// every value 0..255 is exact in bfloat16, so no rounding happens.
// Pure functions: no allocation, safe from any number of threads on distinct outputs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zrl {

// src: n * c * hw uint8 ([N, C, H*W]); dst: n * hw * c values ([N, H*W, C]), aligned for
// their type. They must not overlap.
void planes_to_channels_last(const std::uint8_t* src, std::size_t n, std::size_t c,
                             std::size_t hw, float* dst);
void planes_to_channels_last_bf16(const std::uint8_t* src, std::size_t n, std::size_t c,
                                  std::size_t hw, std::uint16_t* dst);
// The relayout alone, uint8 to uint8: the input of an int8 convolution (oneDNN's, which
// takes uint8 [N, H, W, C] without a reorder of its own; with NCHW it reorders at ~10 us
// per frame).
void planes_to_channels_last_u8(const std::uint8_t* src, std::size_t n, std::size_t c,
                                std::size_t hw, std::uint8_t* dst);

}  // namespace zrl
