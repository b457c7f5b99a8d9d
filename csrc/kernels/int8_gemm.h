// An int8 layer for an actor's policy on x86 CPUs with AVX2 or AVX-512 VNNI.
//
// Int8Torso (zrl/models/cnn.py) runs the shallow CNN's convolutions and FC as int8
// products. Where the CPU has AVX2 but no VNNI, oneDNN's int8 kernels reach ~45 (convs)
// and ~30 (FC, 8 rows) billion multiply-adds per second on one core; this kernel is one
// loop for all three layers, written for their shapes:
//
//   for p < P, oc < OC:
//     acc    = sum over j < J, q < 4 of x[base[p] + offs[j] + q] * w[((oc / 16) * J + j) * 64 + (oc % 16) * 4 + q]
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
// The weights come in blocks of 16 outputs, [OC / 16][J][16][4]: a tile of 16 outputs reads
// its J runs of 64 bytes one after the other. (Laid out [J][OC][4], the runs of a large
// layer lie OC * 4 bytes apart, which the hardware's prefetchers follow poorly: Pong's FC,
// 663 KB of weights, took ~175 us on 8 rows inside an actor, whose emulator threads push
// the weights out of the caches between calls, and ~80 us in blocks.)
//
// Three kernels (Int8Kernel; kAuto takes the first this CPU runs):
//   - "avx512_vnni" (AVX-512 with VNNI: Intel Ice Lake and later, AMD Zen 4 and later):
//     vpdpbusd sums 4 products straight into int32, exactly, whatever the weights.
//   - "avx2": vpmaddubsw adds pairs of products in saturating int16, so the caller keeps
//     x[a] w[a] + x[b] w[b] within int16 (|w| <= 63 for x up to 255, |w| <= 127 for x up
//     to 127; zrl's int8_weight_max, which is 63 exactly where this kernel runs).
//   - "portable": the plain loop.
// The exact kernels give the sums in int32 while 4 J x 255 x 127 fits (J <= kInt8LayerMaxJ:
// zrl._core.int8_layer refuses more); within that range all three agree. OC must be a multiple of 16.
// Pure function: safe from any number of threads on distinct outputs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zrl {

struct Int8Layer {
  const std::int8_t* w;       // [OC / 16][J][16][4]: blocks of 16 outputs
  std::size_t J;              // runs of 4 input bytes per output
  std::size_t OC;             // outputs per position, a multiple of 16
  const std::int32_t* offs;   // [J]
  const float* scale;         // [OC]: the weights' scale x the input's
  const float* bias;          // [OC]
};

// The kernels (see above). kAuto: the fastest this CPU runs.
enum class Int8Kernel { kAuto, kAvx512Vnni, kAvx2, kPortable };

// Every kernel but kAuto, fastest first: kAuto picks the first of these that runs here.
inline constexpr Int8Kernel kInt8Kernels[] = {Int8Kernel::kAvx512Vnni, Int8Kernel::kAvx2, Int8Kernel::kPortable};

// The largest J whose sums fit int32 whatever the inputs: an output sums 4 J products of up to 255 x 127.
inline constexpr std::size_t kInt8LayerMaxJ = INT32_MAX / (4 * 255 * 127);

// Whether every run x[base[p] + offs[j] + q] (p < P, j < J, q < 4) lies inside x's x_bytes;
// true when P or J is 0. Computed in 128 bits, so a hostile base near INT64_MAX cannot
// wrap past the check.
bool int8_runs_inside(const std::int64_t* base, std::size_t P, const std::int32_t* offs, std::size_t J,
                      std::size_t x_bytes);

// Whether `kernel` runs on this CPU (x86-64 built by GCC or Clang, and the CPU's features).
bool int8_kernel_runs(Int8Kernel kernel);

// "avx512_vnni", "avx2" or "portable": kAuto names the one it picks here.
const char* int8_kernel_name(Int8Kernel kernel);

// One layer over P positions (see above). out_u8 [P, OC] when given (qmax <= 255), else
// out_f32 [P, OC]. Returns false (writing nothing) if OC is not a multiple of 16 or
// `kernel` does not run on this CPU.
bool int8_layer(const std::uint8_t* x, const std::int64_t* base, std::size_t P, const Int8Layer& layer,
                float inv_out_scale, int qmax, std::uint8_t* out_u8, float* out_f32,
                Int8Kernel kernel = Int8Kernel::kAuto);

}  // namespace zrl
