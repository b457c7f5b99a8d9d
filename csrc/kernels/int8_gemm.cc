#include "kernels/int8_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ZRL_INT8_AVX2 1
#endif
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
// GCC 12 warns about the undefined pass-through vector inside its own AVX-512 intrinsics
// (_mm512_undefined_ps: GCC bug 105593, fixed in 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace zrl {
namespace {

// clamp(round_half_even(v), 0, qmax), clamping first so that huge values cannot wrap.
inline std::uint8_t requantize(float v, float top) {
  v = v > 0.0f ? v : 0.0f;  // also maps NaN to 0
  v = v < top ? v : top;
  return static_cast<std::uint8_t>(std::nearbyint(v));
}

#ifdef ZRL_INT8_AVX2

// 4 positions x 16 outputs per tile: 8 accumulators of 8 int32, 2 registers of weights (16
// outputs x 4 bytes), one broadcast run of 4 input bytes per position. Per run: 8 vpmaddubsw
// (pairs of u8 x s8 -> int16), 8 vpmaddwd by ones (pairs of int16 -> int32), 8 adds.
__attribute__((target("avx2,fma"))) void layer_avx2(const std::uint8_t* x, const std::int64_t* base, std::size_t P,
                                                     const Int8Layer& L, float inv_out_scale, int qmax,
                                                     std::uint8_t* out_u8, float* out_f32) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256 inv = _mm256_set1_ps(inv_out_scale);
  const __m256 zero = _mm256_setzero_ps();
  const __m256 top = _mm256_set1_ps(static_cast<float>(qmax));
  const std::size_t OC = L.OC, J = L.J;
  for (std::size_t p0 = 0; p0 < P; p0 += 4) {
    const std::uint8_t* rows[4];
    for (std::size_t r = 0; r < 4; ++r) rows[r] = x + base[p0 + r < P ? p0 + r : P - 1];  // a short last tile repeats its last row
    for (std::size_t oc0 = 0; oc0 < OC; oc0 += 16) {
      __m256i acc[4][2];
      for (auto& a : acc) a[0] = a[1] = _mm256_setzero_si256();
      const std::int8_t* wp = L.w + oc0 * J * 4;  // this block's runs, one after the other
      for (std::size_t j = 0; j < J; ++j) {
        const std::int8_t* wj = wp + j * 64;
        const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wj));
        const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wj + 32));
        const std::int32_t o = L.offs[j];
        for (std::size_t r = 0; r < 4; ++r) {
          std::int32_t run;
          std::memcpy(&run, rows[r] + o, sizeof run);
          const __m256i a = _mm256_set1_epi32(run);
          acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a, w0), ones));
          acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a, w1), ones));
        }
      }
      const __m256 s0 = _mm256_loadu_ps(L.scale + oc0), s1 = _mm256_loadu_ps(L.scale + oc0 + 8);
      const __m256 b0 = _mm256_loadu_ps(L.bias + oc0), b1 = _mm256_loadu_ps(L.bias + oc0 + 8);
      for (std::size_t r = 0; r < 4 && p0 + r < P; ++r) {
        const __m256 y0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][0]), s0, b0);
        const __m256 y1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][1]), s1, b1);
        const std::size_t at = (p0 + r) * OC + oc0;
        if (out_u8 != nullptr) {
          // Clamp in float (max first: NaN -> 0), round half to even (MXCSR's default), narrow.
          const __m256i q0 = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(y0, inv), zero), top));
          const __m256i q1 = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(y1, inv), zero), top));
          // packs works within 128-bit lanes: [q0 0-3, q1 0-3 | q0 4-7, q1 4-7] -> reorder to q0 0-7, q1 0-7.
          const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8);
          const __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(out_u8 + at), bytes);
        } else {
          _mm256_storeu_ps(out_f32 + at, _mm256_max_ps(y0, zero));
          _mm256_storeu_ps(out_f32 + at + 8, _mm256_max_ps(y1, zero));
        }
      }
    }
  }
}

// With AVX-512 VNNI: 8 positions x 16 outputs per tile, one 512-bit accumulator of 16 int32
// per position, one register of weights (16 outputs x 4 bytes) per run. Per run: 8 vpdpbusd
// (4 u8 x s8 products summed straight into int32: exact, nothing saturates, so weights may
// take the whole int8 range), against the AVX2 kernel's 24 instructions for half the outputs.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma"))) void layer_vnni(
    const std::uint8_t* x, const std::int64_t* base, std::size_t P, const Int8Layer& L, float inv_out_scale, int qmax,
    std::uint8_t* out_u8, float* out_f32) {
  constexpr std::size_t kRows = 8;
  const __m512 inv = _mm512_set1_ps(inv_out_scale);
  const __m512 zero = _mm512_setzero_ps();
  const __m512 top = _mm512_set1_ps(static_cast<float>(qmax));
  const std::size_t OC = L.OC, J = L.J;
  for (std::size_t p0 = 0; p0 < P; p0 += kRows) {
    const std::uint8_t* rows[kRows];
    for (std::size_t r = 0; r < kRows; ++r) rows[r] = x + base[p0 + r < P ? p0 + r : P - 1];  // a short last tile repeats its last row
    for (std::size_t oc0 = 0; oc0 < OC; oc0 += 16) {
      __m512i acc[kRows];
      for (auto& a : acc) a = _mm512_setzero_si512();
      const std::int8_t* wp = L.w + oc0 * J * 4;  // this block's runs, one after the other
      for (std::size_t j = 0; j < J; ++j) {
        const __m512i w = _mm512_loadu_si512(wp + j * 64);
        const std::int32_t o = L.offs[j];
        for (std::size_t r = 0; r < kRows; ++r) {
          std::int32_t run;
          std::memcpy(&run, rows[r] + o, sizeof run);
          acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_set1_epi32(run), w);
        }
      }
      const __m512 s = _mm512_loadu_ps(L.scale + oc0), b = _mm512_loadu_ps(L.bias + oc0);
      for (std::size_t r = 0; r < kRows && p0 + r < P; ++r) {
        const __m512 y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r]), s, b);
        const std::size_t at = (p0 + r) * OC + oc0;
        if (out_u8 != nullptr) {
          // Clamp in float (max first: NaN -> 0), round half to even (MXCSR's default), narrow.
          const __m512i q = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(y, inv), zero), top));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(out_u8 + at), _mm512_cvtusepi32_epi8(q));
        } else {
          _mm512_storeu_ps(out_f32 + at, _mm512_max_ps(y, zero));
        }
      }
    }
  }
}

#endif

}  // namespace

namespace {

bool cpu_has_avx2() {
#ifdef ZRL_INT8_AVX2
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

bool cpu_has_avx512_vnni() {
#ifdef ZRL_INT8_AVX2
  static const bool has = cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  return has;
#else
  return false;
#endif
}

bool layer_portable(const std::uint8_t* x, const std::int64_t* base, std::size_t P, const Int8Layer& L,
                    float inv_out_scale, int qmax, std::uint8_t* out_u8, float* out_f32) {
  const float top = static_cast<float>(qmax);
  for (std::size_t p = 0; p < P; ++p) {
    const std::uint8_t* row = x + base[p];
    for (std::size_t oc = 0; oc < L.OC; ++oc) {
      std::int32_t acc = 0;
      for (std::size_t j = 0; j < L.J; ++j) {
        const std::uint8_t* a = row + L.offs[j];
        const std::int8_t* w = L.w + ((oc / 16) * L.J + j) * 64 + (oc % 16) * 4;
        for (int q = 0; q < 4; ++q) acc += static_cast<std::int32_t>(a[q]) * w[q];
      }
      const float y = std::fma(static_cast<float>(acc), L.scale[oc], L.bias[oc]);
      if (out_u8 != nullptr) {
        out_u8[p * L.OC + oc] = requantize(y * inv_out_scale, top);
      } else {
        out_f32[p * L.OC + oc] = y > 0.0f ? y : 0.0f;
      }
    }
  }
  return true;
}

Int8Kernel auto_kernel() {
  return cpu_has_avx512_vnni() ? Int8Kernel::kAvx512Vnni : cpu_has_avx2() ? Int8Kernel::kAvx2 : Int8Kernel::kPortable;
}

}  // namespace

bool int8_kernel_runs(Int8Kernel kernel) {
  switch (kernel) {
    case Int8Kernel::kAuto:
    case Int8Kernel::kPortable: return true;
    case Int8Kernel::kAvx2: return cpu_has_avx2();
    case Int8Kernel::kAvx512Vnni: return cpu_has_avx512_vnni();
  }
  return false;
}

const char* int8_kernel_name(Int8Kernel kernel) {
  switch (kernel == Int8Kernel::kAuto ? auto_kernel() : kernel) {
    case Int8Kernel::kAvx512Vnni: return "avx512_vnni";
    case Int8Kernel::kAvx2: return "avx2";
    default: return "portable";
  }
}

bool int8_runs_inside(const std::int64_t* base, std::size_t P, const std::int32_t* offs, std::size_t J,
                      std::size_t x_bytes) {
  if (P == 0 || J == 0) return true;
  const auto [bl, bh] = std::minmax_element(base, base + P);
  const auto [ol, oh] = std::minmax_element(offs, offs + J);
  return static_cast<__int128>(*bl) + *ol >= 0 && static_cast<__int128>(*bh) + *oh + 4 <= static_cast<__int128>(x_bytes);
}

bool int8_layer(const std::uint8_t* x, const std::int64_t* base, std::size_t P, const Int8Layer& L,
                float inv_out_scale, int qmax, std::uint8_t* out_u8, float* out_f32, Int8Kernel kernel) {
  if (L.OC % 16 != 0 || !int8_kernel_runs(kernel)) return false;
  if (kernel == Int8Kernel::kAuto) kernel = auto_kernel();
#ifdef ZRL_INT8_AVX2
  if (kernel == Int8Kernel::kAvx512Vnni) {
    layer_vnni(x, base, P, L, inv_out_scale, qmax, out_u8, out_f32);
    return true;
  }
  if (kernel == Int8Kernel::kAvx2) {
    layer_avx2(x, base, P, L, inv_out_scale, qmax, out_u8, out_f32);
    return true;
  }
#endif
  return layer_portable(x, base, P, L, inv_out_scale, qmax, out_u8, out_f32);
}

}  // namespace zrl
