// GoogleTest of send_frame's row copy within a frame (wire/zmq_native.h, RowCopy).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "wire/zmq_native.h"

namespace {

TEST(RowCopy, FitsOnlyWhereBothRangesLieInsideTheFrame) {
  EXPECT_TRUE((zrl::RowCopy{0, 8, 8}.fits(16)));
  EXPECT_TRUE((zrl::RowCopy{16, 16, 0}.fits(16)));
  EXPECT_FALSE((zrl::RowCopy{0, 9, 8}.fits(16)));
  EXPECT_FALSE((zrl::RowCopy{9, 0, 8}.fits(16)));
  EXPECT_FALSE((zrl::RowCopy{0, 0, 17}.fits(16)));
  const uint64_t huge = std::numeric_limits<uint64_t>::max();
  EXPECT_FALSE((zrl::RowCopy{huge, 0, 2}.fits(16)));  // to + n would wrap
  EXPECT_FALSE((zrl::RowCopy{0, huge - 1, 2}.fits(16)));
}

TEST(RowCopy, CopiesOverlappingRangesAsMemmoveDoes) {
  std::vector<uint8_t> frame(12);
  std::iota(frame.begin(), frame.end(), 0);
  zrl::RowCopy{2, 0, 6}.apply(frame.data());
  EXPECT_EQ(frame, (std::vector<uint8_t>{0, 1, 0, 1, 2, 3, 4, 5, 8, 9, 10, 11}));
  zrl::RowCopy{0, 0, 0}.apply(frame.data());  // nothing
  EXPECT_EQ(frame[0], 0);
}

}  // namespace
