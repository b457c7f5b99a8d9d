// GoogleTest of FrameGate: it vouches for a frame whose descriptors were
// registered and whose values are in bounds, and for nothing else: every
// header field, the block, the array span and each bound can fail it.
#include "wire_gate.h"

#include <gtest/gtest.h>

#include "tests/gate_frame.h"

#include <cstdint>
#include <cstring>
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

}  // namespace
