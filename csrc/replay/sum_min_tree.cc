// The 16-ary sum/min tree. See sum_min_tree.h for the layout and why.
#include "replay/sum_min_tree.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace zrl {
namespace {

constexpr std::size_t F = SumMinTree::kFanout;
constexpr float kInf = std::numeric_limits<float>::infinity();
// x * kBelowOne < x for every positive normal double x.
constexpr double kBelowOne = 1.0 - 0x1.0p-52;

std::size_t round_up(std::size_t n) { return (n + F - 1) / F * F; }

// Inclusive prefix sums of 16 values: p[15] is the group's sum, and the
// result is non-decreasing for non-negative values (the binary search needs
// that). A plain running sum: its 15-add chain is long, but the groups that
// fix_dirty sweeps are independent, so the core overlaps several of them.
template <typename T, typename P>
inline void prefix16(const T* __restrict__ c, P* __restrict__ p) {
  P run = 0;
  for (std::size_t k = 0; k < F; ++k) {
    run += P(c[k]);
    p[k] = run;
  }
}

// Minima over 16 non-negative floats (+inf included). For non-negative
// floats the bit patterns order like the values; an empty leaf's pattern (0)
// is replaced by +inf's before the minimum. SSE2 (every x86-64) does four at
// a time; elsewhere the same on integers, which compilers vectorise without
// the NaN rules that hold back a float minimum.
constexpr uint32_t kInfBits = 0x7F800000u;

#if defined(__SSE2__)
inline float hmin(__m128 m) {
  m = _mm_min_ps(m, _mm_movehl_ps(m, m));
  m = _mm_min_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

inline float min16_leaves(const float* c) {
  const __m128i inf = _mm_set1_epi32(int(kInfBits));
  __m128 m = _mm_castsi128_ps(inf);
  for (std::size_t k = 0; k < F; k += 4) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + k));
    const __m128i empty = _mm_cmpeq_epi32(x, _mm_setzero_si128());
    m = _mm_min_ps(m, _mm_castsi128_ps(_mm_or_si128(x, _mm_and_si128(empty, inf))));
  }
  return hmin(m);
}

inline float min16(const float* c) {
  __m128 m = _mm_min_ps(_mm_loadu_ps(c), _mm_loadu_ps(c + 4));
  m = _mm_min_ps(m, _mm_min_ps(_mm_loadu_ps(c + 8), _mm_loadu_ps(c + 12)));
  return hmin(m);
}
#else
inline uint32_t float_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

inline float bits_float(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof(x));
  return x;
}

inline float min16_leaves(const float* c) {
  uint32_t m = kInfBits;
  for (std::size_t k = 0; k < F; ++k) {
    const uint32_t b = float_bits(c[k]);
    m = std::min(m, b == 0 ? kInfBits : b);
  }
  return bits_float(m);
}

inline float min16(const float* c) {
  uint32_t m = kInfBits;
  for (std::size_t k = 0; k < F; ++k) m = std::min(m, float_bits(c[k]));
  return bits_float(m);
}
#endif

// Which child of a group holds `u` (a mass relative to the group's start),
// given the group's inclusive prefix sums p[16]; `u` is made relative to that
// child. Branch-free binary search: j ends as the number of prefixes <= u.
// u is first clamped below the group's sum, which rounding can push it past;
// then p[j] > u >= p[j - 1], so the child found always has mass.
template <typename P>
inline std::size_t search16(const P* p, double& u) {
  u = std::min(u, double(p[F - 1]) * kBelowOne);
  std::size_t j = 0;
  j += std::size_t(double(p[j + 7]) <= u) * 8;
  j += std::size_t(double(p[j + 3]) <= u) * 4;
  j += std::size_t(double(p[j + 1]) <= u) * 2;
  j += std::size_t(double(p[j]) <= u);
  // p[j - 1], or 0 for the first child, without a branch.
  u -= double(p[(j - 1) & (F - 1)]) * double(j != 0);
  return j;
}

inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }
inline void prefetch_for_write(const void* p) { __builtin_prefetch(p, 1, 3); }

void check_value(float v) {
  if (!(v >= 0.0f) || !(v <= SumMinTree::kMaxLeaf))
    throw std::invalid_argument("values: leaf priorities must be in [0, FLT_MAX / 16]");
}

}  // namespace

SumMinTree::SumMinTree(std::size_t capacity) : capacity_(capacity), root_min_(kInf) {
  if (capacity == 0) throw std::invalid_argument("capacity: must be positive");
  counts_.push_back(round_up(capacity));
  while (counts_.back() > F) counts_.push_back(round_up(counts_.back() / F));
  leaves_ = AlignedArray<float>(counts_[0], 0.0f);
  leaf_prefix_ = AlignedArray<float>(counts_[0], 0.0f);
  prefix_.resize(counts_.size());
  sums_.resize(counts_.size());
  mins_.resize(counts_.size());
  for (std::size_t l = 0; l < counts_.size(); ++l) {
    if (l > 0) {
      prefix_[l] = AlignedArray<double>(counts_[l], 0.0);
      sums_[l] = AlignedArray<double>(counts_[l], 0.0);
      mins_[l] = AlignedArray<float>(counts_[l], kInf);
    }
    dirty_.emplace_back((counts_[l] / F + 63) / 64, 0);
  }
  dirty_lo_.assign(counts_.size(), SIZE_MAX);
  dirty_hi_.assign(counts_.size(), 0);
}

void SumMinTree::mark_dirty(std::size_t level, std::size_t group) {
  const std::size_t word = group / 64;
  dirty_[level][word] |= uint64_t{1} << (group % 64);
  dirty_lo_[level] = std::min(dirty_lo_[level], word);
  dirty_hi_[level] = std::max(dirty_hi_[level], word);
}

// Recomputes one group's prefix sums from its values, and its entry (sum and
// minimum) one level up, which makes that entry's group dirty in turn.
void SumMinTree::fix_group(std::size_t level, std::size_t group) {
  const std::size_t base = group * F;
  double sum;
  float m;
  if (level == 0) {
    float* p = leaf_prefix_.data() + base;
    prefix16(leaves_.data() + base, p);
    sum = p[F - 1];
    m = min16_leaves(leaves_.data() + base);
  } else {
    double* p = prefix_[level].data() + base;
    prefix16(sums_[level].data() + base, p);
    sum = p[F - 1];
    m = min16(mins_[level].data() + base);
  }
  if (level == top()) {
    root_min_ = m;
  } else {
    sums_[level + 1][group] = sum;
    mins_[level + 1][group] = m;
    mark_dirty(level + 1, group / F);
  }
}

// Fixes the dirty groups level by level, bottom-up, each once, in address order.
void SumMinTree::fix_dirty() {
  for (std::size_t l = 0; l < counts_.size(); ++l) {
    std::vector<uint64_t>& bits = dirty_[l];
    for (std::size_t w = dirty_lo_[l]; w <= dirty_hi_[l] && w < bits.size(); ++w) {
      uint64_t word = bits[w];
      bits[w] = 0;
      while (word) {
        fix_group(l, w * 64 + std::size_t(__builtin_ctzll(word)));
        word &= word - 1;
      }
    }
    dirty_lo_[l] = SIZE_MAX;
    dirty_hi_[l] = 0;
  }
}

void SumMinTree::set(const int64_t* slots, const float* values, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (slots[i] < 0 || static_cast<uint64_t>(slots[i]) >= capacity_)
      throw std::out_of_range("slots: slot " + std::to_string(slots[i]) + " is outside [0, " +
                              std::to_string(capacity_) + ")");
    check_value(values[i]);
  }
  // The lines an update a few ahead will write are fetched while this one is
  // marked, so that fix_dirty finds them in cache.
  constexpr std::size_t kAhead = 8;
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      const std::size_t s = std::size_t(slots[i + kAhead]);
      prefetch_for_write(leaves_.data() + s);
      prefetch_for_write(leaf_prefix_.data() + s);
      if (top() > 0) {
        prefetch_for_write(sums_[1].data() + s / F);
        prefetch_for_write(mins_[1].data() + s / F);
      }
    }
    const std::size_t s = std::size_t(slots[i]);
    leaves_[s] = values[i];
    mark_dirty(0, s / F);
  }
  fix_dirty();
}

void SumMinTree::set_range(std::size_t first, const float* values, std::size_t n) {
  if (first > capacity_ || n > capacity_ - first)
    throw std::out_of_range("slots: range [" + std::to_string(first) + ", " +
                            std::to_string(first + n) + ") is outside [0, " +
                            std::to_string(capacity_) + ")");
  if (n == 0) return;
  for (std::size_t i = 0; i < n; ++i) check_value(values[i]);
  std::copy(values, values + n, leaves_.data() + first);
  for (std::size_t g = first / F; g <= (first + n - 1) / F; ++g) mark_dirty(0, g);
  fix_dirty();
}

void SumMinTree::clear() {
  std::fill(leaves_.data(), leaves_.data() + counts_[0], 0.0f);
  std::fill(leaf_prefix_.data(), leaf_prefix_.data() + counts_[0], 0.0f);
  for (std::size_t l = 1; l < counts_.size(); ++l) {
    std::fill(prefix_[l].data(), prefix_[l].data() + counts_[l], 0.0);
    std::fill(sums_[l].data(), sums_[l].data() + counts_[l], 0.0);
    std::fill(mins_[l].data(), mins_[l].data() + counts_[l], kInf);
  }
  root_min_ = kInf;
}

std::size_t SumMinTree::find(double mass) const {
  int64_t slot;
  float leaf_value;
  find_many(&mass, 1, &slot, &leaf_value);
  return static_cast<std::size_t>(slot);
}

void SumMinTree::find_many(const double* masses, std::size_t n, int64_t* slots, float* leaf_values,
                           const std::vector<SlotRows>& rows) const {
  if (!(total() > 0.0)) throw std::invalid_argument("find: the tree is empty");
  for (std::size_t base = 0; base < n; base += kGroup) {
    const std::size_t g = std::min(kGroup, n - base);
    double u[kGroup];
    std::size_t entry[kGroup];  // the entry chosen at the level just searched
    for (std::size_t k = 0; k < g; ++k) {
      u[k] = std::max(masses[base + k], 0.0);
      entry[k] = 0;  // the top level is one group: group 0
    }
    // Every descent takes one step per round, so the prefetch issued for a
    // descent's next group has g - 1 other searches' time to arrive.
    for (std::size_t l = top(); l >= 1; --l) {
      const double* prefix = prefix_[l].data();
      for (std::size_t k = 0; k < g; ++k) {
        const std::size_t group = entry[k];
        entry[k] = group * F + search16(prefix + group * F, u[k]);
        if (l > 1) {
          const double* next = prefix_[l - 1].data() + entry[k] * F;
          prefetch(next);
          prefetch(next + 8);  // 16 doubles span two lines
        } else {
          prefetch(leaf_prefix_.data() + entry[k] * F);
          prefetch(leaves_.data() + entry[k] * F);
        }
      }
    }
    for (std::size_t k = 0; k < g; ++k) {
      const std::size_t group = entry[k];
      entry[k] = group * F + search16(leaf_prefix_.data() + group * F, u[k]);
      for (const SlotRows& r : rows)
        __builtin_prefetch(static_cast<const char*>(r.base) + entry[k] * r.row_bytes, 0, 2);
    }
    for (std::size_t k = 0; k < g; ++k) {
      slots[base + k] = static_cast<int64_t>(entry[k]);
      leaf_values[base + k] = leaves_[entry[k]];
    }
  }
}

void SumMinTree::sample_stratified(std::size_t n, Xoshiro256pp& rng, int64_t* slots,
                                   float* leaf_values, const std::vector<SlotRows>& rows) const {
  const double tot = total();
  if (!(tot > 0.0)) throw std::invalid_argument("sample: the tree is empty");
  const double segment = tot / static_cast<double>(n);
  constexpr std::size_t kChunk = 256;
  double masses[kChunk];
  for (std::size_t base = 0; base < n; base += kChunk) {
    const std::size_t m = std::min(kChunk, n - base);
    for (std::size_t k = 0; k < m; ++k)
      masses[k] = (static_cast<double>(base + k) + rng.uniform()) * segment;
    find_many(masses, m, slots + base, leaf_values + base, rows);
  }
}

bool SumMinTree::check_invariants(std::string* error) const {
  auto fail = [error](const std::string& why) {
    if (error) *error = why;
    return false;
  };
  for (std::size_t i = 0; i < counts_[0]; ++i) {
    const float v = leaves_[i];
    if (!(v >= 0.0f) || !std::isfinite(v))
      return fail("leaf " + std::to_string(i) + " is negative or not finite");
    if (i >= capacity_ && v != 0.0f) return fail("padding leaf " + std::to_string(i) + " is not 0");
  }
  for (std::size_t l = 0; l < counts_.size(); ++l) {
    for (std::size_t group = 0; group < counts_[l] / F; ++group) {
      const std::size_t base = group * F;
      bool prefix_ok;
      double sum;
      float m;
      if (l == 0) {
        float p[F];
        prefix16(leaves_.data() + base, p);
        prefix_ok = std::equal(p, p + F, leaf_prefix_.data() + base);
        sum = p[F - 1];
        m = min16_leaves(leaves_.data() + base);
      } else {
        double p[F];
        prefix16(sums_[l].data() + base, p);
        prefix_ok = std::equal(p, p + F, prefix_[l].data() + base);
        sum = p[F - 1];
        m = min16(mins_[l].data() + base);
      }
      const std::string where = "level " + std::to_string(l) + " group " + std::to_string(group);
      if (!prefix_ok) return fail(where + ": prefix sums disagree with the values");
      if (l == top()) {
        if (m != root_min_) return fail(where + ": the root minimum disagrees");
      } else if (sums_[l + 1][group] != sum || mins_[l + 1][group] != m) {
        return fail(where + ": its entry one level up disagrees");
      }
    }
    if (l > 0) {
      // Padding entries past the groups of level l - 1 stay empty.
      for (std::size_t e = counts_[l - 1] / F; e < counts_[l]; ++e)
        if (sums_[l][e] != 0.0 || mins_[l][e] != kInf)
          return fail("level " + std::to_string(l) + " padding entry " + std::to_string(e) +
                      " is not empty");
    }
  }
  return true;
}

}  // namespace zrl
