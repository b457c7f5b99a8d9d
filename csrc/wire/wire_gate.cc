#include "wire/wire_gate.h"

#include <cstring>
#include <stdexcept>

#include "zrl/wire_format.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
// The checks read the frame's fields and arrays in host order; the wire is little-endian.
#error "zrl's core supports little-endian hosts only"
#endif

namespace zrl {
namespace {

using wire::kDescriptorSize;
using wire::kHeaderSize;
using wire::kMaxArrays;

// Loads from possibly unaligned frame bytes, in host order: little-endian, as the
// wire (checked above).
template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Inlined into each SIMD clone below, so that each clone's loops are built for its target.
#if defined(__GNUC__)
#define ZRL_INLINE inline __attribute__((always_inline))
#else
#define ZRL_INLINE inline
#endif

// The rules' loops over whole arrays, in two forms: kCopy = false only tests src (the
// gate); kCopy = true also stores each element into dst as it tests it (the batch join's
// copy_checked: one pass, so a checked copy costs what a plain one does). Each ORs its
// tests, not an early exit: the loop vectorises, and bad frames are rare.
template <typename T, bool kCopy>
ZRL_INLINE bool below(uint8_t* dst, const uint8_t* src, uint64_t count, uint64_t bound) {
  if (bound > static_cast<uint64_t>(static_cast<T>(~T{0}))) {  // every T is below it
    if constexpr (kCopy) std::memcpy(dst, src, count * sizeof(T));
    return true;
  }
  const T b = static_cast<T>(bound);
  T bad = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const T v = load<T>(src + i * sizeof(T));
    if constexpr (kCopy) std::memcpy(dst + i * sizeof(T), &v, sizeof(T));
    bad |= static_cast<T>(v >= b);
  }
  return bad == 0;
}

// A float is NaN or infinite exactly when its exponent bits are all set, that is when
// adding one to its exponent carries into the sign bit. An OR of those sums vectorises
// (SSE2 and up).
template <typename T, bool kCopy>
ZRL_INLINE bool finite(uint8_t* dst, const uint8_t* src, uint64_t count, T exponent, T one) {
  T carries = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const T v = load<T>(src + i * sizeof(T));
    if constexpr (kCopy) std::memcpy(dst + i * sizeof(T), &v, sizeof(T));
    carries |= static_cast<T>((v & exponent) + one);
  }
  return (carries >> (8 * sizeof(T) - 1)) == 0;
}

template <bool kCopy>
ZRL_INLINE bool below_by_size(uint8_t* dst, const uint8_t* src, uint64_t count, uint32_t itemsize, uint64_t bound) {
  switch (itemsize) {
    case 1: return below<uint8_t, kCopy>(dst, src, count, bound);
    case 2: return below<uint16_t, kCopy>(dst, src, count, bound);
    case 4: return below<uint32_t, kCopy>(dst, src, count, bound);
    default: return below<uint64_t, kCopy>(dst, src, count, bound);
  }
}

template <bool kCopy>
ZRL_INLINE bool finite_by_size(uint8_t* dst, const uint8_t* src, uint64_t count, uint32_t itemsize) {
  switch (itemsize) {
    case 2: return finite<uint16_t, kCopy>(dst, src, count, 0x7C00u, 0x0400u);
    case 4: return finite<uint32_t, kCopy>(dst, src, count, 0x7F800000u, 0x00800000u);
    default: return finite<uint64_t, kCopy>(dst, src, count, 0x7FF0000000000000ull, 0x0010000000000000ull);
  }
}

// The loops over whole arrays (bounds, finite floats) read most of every received
// frame. Built for baseline x86-64 alone, the int64 bounds stayed scalar (SSE2 has no
// 64-bit compare) and the rest ran 4 floats a step: checking a CartPole chunk of 32
// envs (23 KB) took 1.25 us with the data in cache. GCC also builds an AVX2 clone of
// each, picked at load time (an ifunc) where the CPU has AVX2: 0.52 us.
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#define ZRL_SIMD_CLONES __attribute__((noinline, target_clones("avx2", "default")))
#else
#define ZRL_SIMD_CLONES __attribute__((noinline))
#endif

ZRL_SIMD_CLONES bool bound_holds(const uint8_t* data, const GateBound& b) {
  return below_by_size<false>(nullptr, data + b.offset, b.count, b.itemsize, b.bound);
}

// (Not inlined into FrameGate::check: inside its loop over rules GCC vectorised none of
// it, ~0.7 ns a float.)
ZRL_SIMD_CLONES bool finite_holds(const uint8_t* data, const GateFinite& f) {
  return finite_by_size<false>(nullptr, data + f.offset, f.count, f.itemsize);
}

ZRL_SIMD_CLONES bool copy_checked_impl(uint8_t* dst, const uint8_t* src, uint64_t count, uint32_t itemsize,
                                       CopyRule rule, uint64_t bound) {
  if (rule == CopyRule::kFinite) return finite_by_size<true>(dst, src, count, itemsize);
  return below_by_size<true>(dst, src, count, itemsize, bound);
}

bool marks_hold(const uint8_t* data, const GateMarks& m) {
  const uint8_t* marked = data + m.marked_offset;
  const uint8_t* excluded = data + m.excluded_offset;
  const uint8_t* index = data + m.index_offset;
  uint64_t j = 0;
  for (uint64_t p = 0; p < m.flags_count; ++p) {
    if (p % 8 == 0 && p + 8 <= m.flags_count && load<uint64_t>(marked + p) == 0) {
      p += 7;  // eight clear flags at once: truncations are rare
      continue;
    }
    if (marked[p] == 0) continue;
    if (j == m.index_count || load<uint32_t>(index + 4 * j) != p || excluded[p] != 0) return false;
    ++j;
  }
  return j == m.index_count;
}

bool inside(uint64_t offset, uint64_t bytes, uint64_t first, uint64_t end) {
  return offset >= first && offset <= end && bytes <= end - offset;
}

}  // namespace

FrameGate::FrameGate(uint16_t kind, uint64_t max_bytes) : kind_(kind), max_bytes_(max_bytes) {}

int FrameGate::add(const std::string& block, uint64_t first, uint64_t end,
                   const std::vector<GateBound>& bounds, const std::vector<GateMarks>& marks,
                   const std::vector<GateFinite>& finite) {
  if (block.empty() || block.size() % kDescriptorSize != 0 ||
      block.size() / kDescriptorSize > kMaxArrays)
    throw std::invalid_argument("descriptor block of " + std::to_string(block.size()) +
                                " bytes: expected 1 to 64 descriptors of 80 bytes");
  if (first > end) throw std::invalid_argument("arrays span [first, end) with first > end");
  for (const GateBound& b : bounds) {
    if (b.itemsize != 1 && b.itemsize != 2 && b.itemsize != 4 && b.itemsize != 8)
      throw std::invalid_argument("bound itemsize " + std::to_string(b.itemsize) +
                                  ": expected 1, 2, 4 or 8");
    if (b.offset < first || b.offset > end || b.count > (end - b.offset) / b.itemsize)
      throw std::invalid_argument("bound's array lies outside the arrays' span");
  }
  for (const GateMarks& m : marks) {
    if (m.index_count > (end - first) / 4 || !inside(m.index_offset, 4 * m.index_count, first, end) ||
        !inside(m.marked_offset, m.flags_count, first, end) || !inside(m.excluded_offset, m.flags_count, first, end))
      throw std::invalid_argument("marks rule's arrays lie outside the arrays' span");
  }
  for (const GateFinite& f : finite) {
    if (f.itemsize != 2 && f.itemsize != 4 && f.itemsize != 8)
      throw std::invalid_argument("finite rule itemsize " + std::to_string(f.itemsize) + ": expected 2, 4 or 8");
    if (f.offset < first || f.offset > end || f.count > (end - f.offset) / f.itemsize)
      throw std::invalid_argument("finite rule's array lies outside the arrays' span");
  }
  if (layouts_.size() < kMaxLayouts) {
    layouts_.push_back(Layout{block, first, end, bounds, marks, finite});
    return static_cast<int>(layouts_.size() - 1);
  }
  const std::size_t slot = next_;
  next_ = (next_ + 1) % kMaxLayouts;
  layouts_[slot] = Layout{block, first, end, bounds, marks, finite};
  return static_cast<int>(slot);
}

void FrameGate::clear() {
  layouts_.clear();
  next_ = 0;
}

GateResult FrameGate::check(const uint8_t* data, std::size_t n) const {
  GateResult r;
  if (layouts_.empty() || n > max_bytes_ || n < kHeaderSize) return r;
  if (std::memcmp(data + wire::kMagicOffset, wire::kMagic, sizeof wire::kMagic) != 0) return r;
  if (load<uint16_t>(data + wire::kVersionOffset) != wire::kProtocolVersion ||
      load<uint16_t>(data + wire::kKindOffset) != kind_)
    return r;
  const uint32_t n_arrays = load<uint32_t>(data + wire::kArrayCountOffset);
  const uint32_t meta_len = load<uint32_t>(data + wire::kMetaLenOffset);
  if (load<uint32_t>(data + wire::kFlagsOffset) != 0 || load<uint64_t>(data + wire::kTotalOffset) != n) return r;
  if (n_arrays == 0 || n_arrays > kMaxArrays) return r;
  if ((load<uint64_t>(data + wire::kSeqOffset) | load<uint64_t>(data + wire::kPolicyVersionOffset)) >> 63) return r;
  const uint64_t meta_offset = kHeaderSize + kDescriptorSize * uint64_t{n_arrays};
  const uint64_t data_start = meta_offset + meta_len;
  if (data_start > n) return r;
  const std::size_t block_len = kDescriptorSize * n_arrays;
  for (std::size_t i = 0; i < layouts_.size(); ++i) {
    const Layout& L = layouts_[i];
    if (L.block.size() != block_len || std::memcmp(L.block.data(), data + kHeaderSize, block_len) != 0)
      continue;
    if (L.first < data_start || L.end > n) return r;
    for (const GateBound& b : L.bounds) {
      if (!bound_holds(data, b)) return r;
    }
    for (const GateFinite& f : L.finite) {
      if (!finite_holds(data, f)) return r;
    }
    for (const GateMarks& m : L.marks) {
      if (!marks_hold(data, m)) return r;
    }
    r.layout = static_cast<int>(i);
    r.sender_id = load<uint32_t>(data + wire::kSenderIdOffset);
    r.seq = load<uint64_t>(data + wire::kSeqOffset);
    r.policy_version = load<uint64_t>(data + wire::kPolicyVersionOffset);
    r.meta_offset = meta_offset;
    r.meta_len = meta_len;
    return r;
  }
  return r;
}

bool copy_checked(uint8_t* dst, const uint8_t* src, uint64_t count, uint32_t itemsize, CopyRule rule,
                  uint64_t bound) {
  if (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8)
    throw std::invalid_argument("copy_checked: itemsize " + std::to_string(itemsize) + ": expected 1, 2, 4 or 8");
  if (rule == CopyRule::kFinite && itemsize == 1)
    throw std::invalid_argument("copy_checked: a finite rule needs itemsize 2, 4 or 8");
  if (count == 0) return true;
  if (rule == CopyRule::kNone) {
    std::memcpy(dst, src, count * itemsize);
    return true;
  }
  return copy_checked_impl(dst, src, count, itemsize, rule, bound);
}

}  // namespace zrl
