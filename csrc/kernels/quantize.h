// Per-row int8 quantization of a layer's weights, for an actor's int8 policy.
//
// An int8 FC layer (zrl/models/cnn.py, Int8Torso) needs its weights as int8 with
// one scale per output row, requantized on every weights update the actor
// receives. PyTorch's ops take 1-2 ms for Pong's 256 x 2,592 FC (a float copy,
// abs, amax, divide, round, clamp, cast: a pass each); this is one pass to find
// each row's largest magnitude and one to write the row.
//
//   scale[r]    = max(max_i |src[r][i]| / 127, 1e-12)
//   out[r][i]   = clamp(round_half_even(src[r][i] / scale[r]), -127, 127)
// the same arithmetic, in float32, as PyTorch's
//   torch.round(w / (w.abs().amax(1) / 127).clamp_min(1e-12)[:, None]).clamp(-127, 127).
// bfloat16 input is read as its bits (the upper half of a float32).
// Pure functions: no allocation, safe from any number of threads on distinct outputs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zrl {

// src: rows * k values; out: rows * k; scales: rows. Returns false if a value of src is not
// finite (NaN or infinite), leaving out and scales unspecified.
bool quantize_rows_int8(const float* src, std::size_t rows, std::size_t k, std::int8_t* out,
                        float* scales);
bool quantize_rows_int8_bf16(const std::uint16_t* src, std::size_t rows, std::size_t k,
                             std::int8_t* out, float* scales);

}  // namespace zrl
