// An int8 layer for an actor's policy on CPUs without int8 dot products (AVX2 alone).
//
// Int8Torso (zrl/models/cnn.py) runs the shallow CNN's convolutions and FC as int8
// products. Where the CPU has AVX2 but no VNNI, oneDNN's int8 kernels reach ~45 (convs)
// and ~30 (FC, 8 rows) billion multiply-adds per second on one core; this kernel is one
// loop for all three layers, written for their shapes:
//
//   for p < P, oc < OC:
//     acc    = sum over j < J, q < 4 of x[base[p] + offs[j] + q] * w[(j * OC + oc) * 4 + q]
//     y      = acc * scale[oc] + bias[oc]                  (float32)
//     out_u8 = clamp(round_half_even(y * inv_out_scale), 0, qmax)   (when out_u8 is given)
//     out_f32= max(y, 0)                                   (otherwise)
//   written at [p * OC + oc]
//
// uint8 x int8 products, int32 accumulators. A convolution without padding is such a
// layer with one output position per p: base[p] is where its receptive field starts in
// x and offs[j] where the field's j-th run of 4 consecutive input bytes lies from there
// (a run of the kernel's width in NCHW input, or of the channels in NHWC input). An FC
// on [P, K] rows is base[p] = p * K, offs[j] = 4 j.
//
// The AVX2 kernel multiplies with vpmaddubsw, which adds pairs of products in saturating
// int16: the caller keeps x[a] w[a] + x[b] w[b] within int16 (|w| <= 63 for x up to
// 255, |w| <= 127 for x up to 127; zrl's int8_weight_max). The portable loop gives the
// exact sums in int32 while 4 J x 255 x 127 fits (J <= 16,579: the binding refuses more);
// within that range the two agree. OC must be a multiple of 16. Pure
// function: safe from any number of threads on distinct outputs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zrl {

struct Int8Layer {
  const std::int8_t* w;       // [J][OC][4]
  std::size_t J;              // runs of 4 input bytes per output
  std::size_t OC;             // outputs per position, a multiple of 16
  const std::int32_t* offs;   // [J]
  const float* scale;         // [OC]: the weights' scale x the input's
  const float* bias;          // [OC]
};

// Whether int8_layer runs its AVX2 kernel here (x86-64, built by GCC or Clang, a CPU with AVX2).
bool int8_layer_avx2();

// One layer over P positions (see above). out_u8 [P, OC] when given (qmax <= 255), else
// out_f32 [P, OC]. Returns false (writing nothing) if OC is not a multiple of 16.
bool int8_layer(const std::uint8_t* x, const std::int64_t* base, std::size_t P, const Int8Layer& layer,
                float inv_out_scale, int qmax, std::uint8_t* out_u8, float* out_f32);

// The portable loop alone (for tests: the AVX2 kernel must give the same outputs).
bool int8_layer_portable(const std::uint8_t* x, const std::int64_t* base, std::size_t P, const Int8Layer& layer,
                         float inv_out_scale, int qmax, std::uint8_t* out_u8, float* out_f32);

}  // namespace zrl
