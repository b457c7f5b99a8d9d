// GoogleTest of FrameGate: it vouches for a frame whose descriptors were
// registered and whose values are in bounds, and for nothing else: every
// header field, the block, the array span and each bound can fail it.
#include "wire/wire_gate.h"

#include <gtest/gtest.h>

#include "tests/gate_frame.h"

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using zrl::FrameGate;
using zrl::GateBound;
using zrl::testing::Frame;
using zrl::testing::kTrajectory;
using zrl::testing::put;

// action < 6, final_index < 10: Impala's bounds for 6 actions, T * K = 10.
FrameGate registered(const Frame& f, uint64_t max_bytes = 1 << 20) {
  FrameGate g(kTrajectory, max_bytes);
  int id = g.add(f.block(), Frame::kAction, Frame::kEnd,
                 {GateBound{Frame::kAction, 4, 8, 6}, GateBound{Frame::kIndex, 2, 4, 10}});
  EXPECT_EQ(id, 0);
  return g;
}

TEST(FrameGate, VouchesForARegisteredLayoutAndReturnsTheHeader) {
  Frame f;
  FrameGate g = registered(f);
  auto r = f.check(g);
  EXPECT_EQ(r.layout, 0);
  EXPECT_EQ(r.sender_id, 7u);
  EXPECT_EQ(r.seq, 42u);
  EXPECT_EQ(r.policy_version, 5u);
  EXPECT_EQ(r.meta_offset, 208u);
  EXPECT_EQ(r.meta_len, 0u);
}

TEST(FrameGate, EmptyGateVouchesForNothing) {
  Frame f;
  FrameGate g(kTrajectory, 1 << 20);
  EXPECT_EQ(f.check(g).layout, -1);
}

TEST(FrameGate, EachHeaderFieldCanFailIt) {
  Frame good;
  FrameGate g = registered(good);
  struct Edit {
    const char* what;
    std::size_t at;
    uint64_t value;
    int width;
  };
  const Edit edits[] = {
      {"magic", 0, 0x58584c5a, 4}, {"version", 4, 2, 2},   {"kind", 6, 5, 2},
      {"arrays", 12, 1, 4},        {"arrays > 64", 12, 65, 4}, {"meta past frame", 32, 100, 4},
      {"flags", 36, 1, 4},         {"total", 40, 327, 8},
  };
  for (const Edit& e : edits) {
    Frame f;
    if (e.width == 2) put<uint16_t>(f.bytes, e.at, static_cast<uint16_t>(e.value));
    if (e.width == 4) put<uint32_t>(f.bytes, e.at, static_cast<uint32_t>(e.value));
    if (e.width == 8) put<uint64_t>(f.bytes, e.at, e.value);
    EXPECT_EQ(f.check(g).layout, -1) << e.what;
  }
}

TEST(FrameGate, LengthLimits) {
  Frame f;
  FrameGate capped = registered(f, Frame::kEnd - 1);
  EXPECT_EQ(f.check(capped).layout, -1);  // over max_bytes
  FrameGate g = registered(f);
  EXPECT_EQ(g.check(f.bytes.data(), 47).layout, -1);               // shorter than a header
  EXPECT_EQ(g.check(f.bytes.data(), Frame::kEnd - 8).layout, -1);  // total != length
}

TEST(FrameGate, AnyOtherDescriptorBlockIsNotVouchedFor) {
  Frame good;
  FrameGate g = registered(good);
  Frame f;
  f.bytes[48] = 'A';  // a name
  EXPECT_EQ(f.check(g).layout, -1);
  Frame s;
  put<uint32_t>(s.bytes, 48 + 40, 3);  // action's shape
  EXPECT_EQ(s.check(g).layout, -1);
}

TEST(FrameGate, MetaOverlappingTheArraysFailsIt) {
  Frame good;
  FrameGate g = registered(good);
  Frame fits(48);  // meta [208, 256): up to the first array
  EXPECT_EQ(fits.check(g).layout, 0);
  EXPECT_EQ(fits.check(g).meta_len, 48u);
  Frame f(49);
  EXPECT_EQ(f.check(g).layout, -1);
}

TEST(FrameGate, ValuesAtOrPastTheBoundFailIt) {
  Frame good;
  FrameGate g = registered(good);
  {
    Frame f;
    put<int64_t>(f.bytes, Frame::kAction + 8, 6);  // action == n
    EXPECT_EQ(f.check(g).layout, -1);
  }
  {
    Frame f;
    put<int64_t>(f.bytes, Frame::kAction + 24, -1);  // negative: huge as unsigned
    EXPECT_EQ(f.check(g).layout, -1);
  }
  {
    Frame f;
    put<int32_t>(f.bytes, Frame::kIndex + 4, 10);
    EXPECT_EQ(f.check(g).layout, -1);
  }
  {
    Frame f;
    put<int64_t>(f.bytes, Frame::kAction, 5);
    put<int32_t>(f.bytes, Frame::kIndex, 0);
    EXPECT_EQ(f.check(g).layout, 0);  // the largest values allowed
  }
}

// Marks: final_index (int32 [2] = {3, 9}) must list exactly where a 10-byte flag
// array is set, in order, with a second flag array clear there. The action
// array's 32 bytes stand in for the two flag arrays: marked at 256, excluded at 266.
TEST(FrameGate, MarksHoldOnlyWhereTheIndexListsEachMarkedPositionInOrder) {
  constexpr uint64_t kMarked = Frame::kAction, kExcluded = Frame::kAction + 10;
  const zrl::GateMarks rule{Frame::kIndex, 2, kMarked, kExcluded, 10};
  auto frame = [&](std::vector<int> marked, std::vector<int> excluded, int32_t i0 = 3, int32_t i1 = 9) {
    Frame f;
    std::memset(f.bytes.data() + Frame::kAction, 0, 32);
    for (int p : marked) f.bytes[kMarked + p] = 1;
    for (int p : excluded) f.bytes[kExcluded + p] = 1;
    put<int32_t>(f.bytes, Frame::kIndex, i0);
    put<int32_t>(f.bytes, Frame::kIndex + 4, i1);
    return f;
  };
  Frame base = frame({3, 9}, {0, 5});
  FrameGate g(kTrajectory, 1 << 20);
  ASSERT_EQ(g.add(base.block(), Frame::kAction, Frame::kEnd, {}, {rule}), 0);
  EXPECT_EQ(base.check(g).layout, 0);
  EXPECT_EQ(frame({3, 9}, {}).check(g).layout, 0);
  Frame two = frame({3, 9}, {});
  two.bytes[kMarked + 9] = 2;  // any non-zero byte is set
  EXPECT_EQ(two.check(g).layout, 0);
  EXPECT_EQ(frame({3, 9}, {3}).check(g).layout, -1);        // a listed position also excluded
  EXPECT_EQ(frame({3, 5, 9}, {}).check(g).layout, -1);      // a marked position not listed
  EXPECT_EQ(frame({3}, {}).check(g).layout, -1);            // a listed position not marked
  EXPECT_EQ(frame({3, 9}, {}, 9, 3).check(g).layout, -1);   // out of order
  EXPECT_EQ(frame({3}, {}, 3, 3).check(g).layout, -1);      // listed twice
  EXPECT_THROW(g.add(base.block(), Frame::kAction, Frame::kEnd, {}, {zrl::GateMarks{Frame::kIndex, 3, kMarked, kExcluded, 10}}),
               std::invalid_argument);  // the index runs past the span
  EXPECT_THROW(g.add(base.block(), Frame::kAction, Frame::kEnd, {}, {zrl::GateMarks{Frame::kIndex, 2, kMarked, Frame::kEnd - 4, 10}}),
               std::invalid_argument);  // a flag array runs past the span
}

// Finite rules: the action array's 32 bytes read as 8 float32, 16 float16 or 4 float64.
TEST(FrameGate, FiniteRulesFailOnANaNOrAnInfinityOnly) {
  Frame base;
  for (uint32_t itemsize : {2u, 4u, 8u}) {
    FrameGate g(kTrajectory, 1 << 20);
    const zrl::GateFinite rule{Frame::kAction, 32 / itemsize, itemsize};
    EXPECT_EQ(g.add(base.block(), Frame::kAction, Frame::kEnd, {}, {}, {rule}), 0);
    EXPECT_EQ(base.check(g).layout, 0) << itemsize;  // zeros
    const uint64_t exponent = itemsize == 2 ? 0x7C00u : itemsize == 4 ? 0x7F800000u : 0x7FF0000000000000ull;
    const uint64_t sign = uint64_t{1} << (8 * itemsize - 1);
    auto with = [&](uint64_t bits, uint64_t at) {
      Frame f;
      std::memcpy(f.bytes.data() + Frame::kAction + at * itemsize, &bits, itemsize);  // little-endian host
      return f.check(g).layout;
    };
    const uint64_t last = 32 / itemsize - 1;
    EXPECT_EQ(with(exponent, last), -1) << itemsize;             // +inf, in the last element
    EXPECT_EQ(with(exponent | sign, 0), -1) << itemsize;         // -inf
    EXPECT_EQ(with(exponent | 1, 1), -1) << itemsize;            // a NaN
    EXPECT_EQ(with(exponent - 1, last), 0) << itemsize;          // the largest finite value
    EXPECT_EQ(with((exponent - 1) | sign, 0), 0) << itemsize;    // and the most negative
  }
}

// The bounds and finite loops are vectorised (with AVX2 where the CPU has it): over
// arrays longer than any vector, at an odd, unaligned offset, one bad value fails the
// frame wherever it lies, in the vector body or in the tail.
TEST(FrameGate, LongArraysFailOnOneBadValueAnywhere) {
  constexpr uint64_t kCount = 203, kAt = 385;  // 203: no vector width divides it; 385: unaligned
  for (uint32_t itemsize : {1u, 2u, 4u, 8u}) {
    Frame f;
    f.bytes.resize(kAt + kCount * itemsize, 0);
    put<uint64_t>(f.bytes, 40, f.bytes.size());  // total
    const uint64_t end = f.bytes.size();
    FrameGate bounds(kTrajectory, 1 << 20);
    ASSERT_EQ(bounds.add(f.block(), Frame::kAction, end, {GateBound{kAt, kCount, itemsize, 3}}), 0);
    FrameGate finite(kTrajectory, 1 << 20);
    if (itemsize > 1) ASSERT_EQ(finite.add(f.block(), Frame::kAction, end, {}, {}, {zrl::GateFinite{kAt, kCount, itemsize}}), 0);
    const uint64_t nan = itemsize == 2 ? 0x7E00u : itemsize == 4 ? 0x7FC00000u : 0x7FF8000000000000ull;
    for (uint64_t i = 0; i < kCount * itemsize; i += itemsize) f.bytes[kAt + i] = 2;  // all below 3
    ASSERT_EQ(f.check(bounds).layout, 0) << itemsize;
    for (uint64_t at = 0; at < kCount; ++at) {
      uint8_t* p = f.bytes.data() + kAt + at * itemsize;
      p[0] = 3;  // the bound itself
      EXPECT_EQ(f.check(bounds).layout, -1) << itemsize << " at " << at;
      p[0] = 2;
      p[itemsize - 1] |= 0x80;  // negative: huge as unsigned
      EXPECT_EQ(f.check(bounds).layout, -1) << itemsize << " at " << at;
      p[itemsize - 1] &= 0x7F;
      if (itemsize > 1) {
        uint8_t saved[8];
        std::memcpy(saved, p, itemsize);
        EXPECT_EQ(f.check(finite).layout, 0) << itemsize << " at " << at;
        std::memcpy(p, &nan, itemsize);  // little-endian host
        EXPECT_EQ(f.check(finite).layout, -1) << itemsize << " at " << at;
        std::memcpy(p, saved, itemsize);
      }
    }
    EXPECT_EQ(f.check(bounds).layout, 0) << itemsize;
  }
}

TEST(FrameGate, BadRegistrationsThrow) {
  FrameGate g(kTrajectory, 1 << 20);
  Frame f;
  EXPECT_THROW(g.add("", 0, 0, {}), std::invalid_argument);
  EXPECT_THROW(g.add(std::string(79, '\0'), 0, 0, {}), std::invalid_argument);
  EXPECT_THROW(g.add(f.block(), 300, 200, {}), std::invalid_argument);
  EXPECT_THROW(g.add(f.block(), 256, 328, {GateBound{256, 4, 3, 6}}), std::invalid_argument);
  EXPECT_THROW(g.add(f.block(), 256, 328, {GateBound{256, 10, 8, 6}}), std::invalid_argument);
  EXPECT_THROW(g.add(f.block(), 256, 328, {GateBound{100, 1, 8, 6}}), std::invalid_argument);
  EXPECT_THROW(g.add(f.block(), 256, 328, {GateBound{~uint64_t{0} - 7, 2, 8, 6}}), std::invalid_argument);  // wraps
  EXPECT_THROW(g.add(f.block(), 256, 328, {}, {}, {zrl::GateFinite{256, 8, 1}}), std::invalid_argument);  // no 1-byte floats
  EXPECT_THROW(g.add(f.block(), 256, 328, {}, {}, {zrl::GateFinite{256, 19, 4}}), std::invalid_argument);  // past the span
  EXPECT_EQ(g.size(), 0u);
}

TEST(FrameGate, AFullGateReplacesItsSlotsInTurn) {
  FrameGate g(kTrajectory, 1 << 20);
  Frame f;
  auto other = [&](std::size_t i) {
    std::string block = f.block();
    block[1] = static_cast<char>('a' + i % 26);
    block[2] = static_cast<char>('a' + i / 26);
    return block;
  };
  EXPECT_EQ(g.add(f.block(), 256, 328, {}), 0);
  for (std::size_t i = 1; i < FrameGate::kMaxLayouts; ++i) EXPECT_EQ(g.add(other(i), 256, 328, {}), static_cast<int>(i));
  EXPECT_EQ(f.check(g).layout, 0);
  EXPECT_EQ(g.add(other(100), 256, 328, {}), 0);  // full: slot 0 goes first
  EXPECT_EQ(g.size(), FrameGate::kMaxLayouts);
  EXPECT_EQ(f.check(g).layout, -1);  // its layout is forgotten
  EXPECT_EQ(g.add(f.block(), 256, 328, {}), 1);
  EXPECT_EQ(f.check(g).layout, 1);
  g.clear();
  EXPECT_EQ(f.check(g).layout, -1);
  EXPECT_EQ(g.add(f.block(), 256, 328, {}), 0);
}

// copy_checked: the batch join's form of the bound and finite rules. It copies every
// element whatever it finds, and reports a bad one anywhere in a long array (the
// vectorised loop's body and its tail).
TEST(CopyChecked, CopiesEveryElementAndReportsTheRule) {
  using zrl::CopyRule;
  using zrl::copy_checked;
  for (std::size_t n : {1u, 7u, 64u, 1001u}) {
    std::vector<float> src(n, 1.5f), dst(n, 0.0f);
    auto* d = reinterpret_cast<uint8_t*>(dst.data());
    auto* s = reinterpret_cast<const uint8_t*>(src.data());
    EXPECT_TRUE(copy_checked(d, s, n, 4, CopyRule::kFinite));
    EXPECT_EQ(dst, src);
    for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()}) {
        std::vector<float> b = src;
        b[at] = bad;
        std::fill(dst.begin(), dst.end(), 0.0f);
        EXPECT_FALSE(copy_checked(d, reinterpret_cast<const uint8_t*>(b.data()), n, 4, CopyRule::kFinite)) << n << " " << at;
        EXPECT_EQ(std::memcmp(dst.data(), b.data(), n * 4), 0);  // copied all the same
      }
    }
    std::vector<double> big(n, std::numeric_limits<double>::max()), out(n);
    EXPECT_TRUE(copy_checked(reinterpret_cast<uint8_t*>(out.data()), reinterpret_cast<const uint8_t*>(big.data()), n, 8,
                             CopyRule::kFinite));
    std::vector<int64_t> acts(n, 5), got(n);
    auto* g = reinterpret_cast<uint8_t*>(got.data());
    EXPECT_TRUE(copy_checked(g, reinterpret_cast<const uint8_t*>(acts.data()), n, 8, CopyRule::kBound, 6));
    EXPECT_EQ(got, acts);
    acts[n - 1] = -1;  // reads as 2^64 - 1
    EXPECT_FALSE(copy_checked(g, reinterpret_cast<const uint8_t*>(acts.data()), n, 8, CopyRule::kBound, 6));
    EXPECT_EQ(got, acts);
    std::vector<uint8_t> flags(n, 1), fout(n);
    EXPECT_TRUE(copy_checked(fout.data(), flags.data(), n, 1, CopyRule::kBound, 2));
    flags[n / 2] = 2;
    EXPECT_FALSE(copy_checked(fout.data(), flags.data(), n, 1, CopyRule::kBound, 2));
    EXPECT_TRUE(copy_checked(fout.data(), flags.data(), n, 1, CopyRule::kNone));
    EXPECT_EQ(fout, flags);
  }
  uint8_t x[8] = {}, y[8] = {};
  EXPECT_TRUE(copy_checked(y, x, 0, 4, CopyRule::kFinite));  // nothing to copy
  EXPECT_THROW(copy_checked(y, x, 1, 3, CopyRule::kNone), std::invalid_argument);
  EXPECT_THROW(copy_checked(y, x, 1, 1, CopyRule::kFinite), std::invalid_argument);
}

}  // namespace
