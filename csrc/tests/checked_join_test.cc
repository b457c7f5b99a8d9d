// GoogleTest of the learner's checked batch join (wire/checked_join.h): the parts
// land where numpy's concatenate puts them, and the rule names each part that broke it.
#include "wire/checked_join.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

namespace {

using zrl::CopyRule;
using zrl::JoinPart;

const uint8_t* bytes(const std::vector<float>& v) { return reinterpret_cast<const uint8_t*>(v.data()); }
const uint8_t* bytes(const std::vector<int32_t>& v) { return reinterpret_cast<const uint8_t*>(v.data()); }

TEST(JoinChecked, JoinsAlongTheMiddleAxisAsConcatenateDoes) {
  // [2, 1, 3] and [2, 2, 3] along axis 1 into [2, 3, 3]: outer 2, counts 3 and 6.
  std::vector<float> a(6), b(12);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = 100.0f + i;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = 200.0f + i;
  std::vector<float> out(18, -1.0f);
  const auto broken = zrl::join_checked(reinterpret_cast<uint8_t*>(out.data()),
                                        {JoinPart{bytes(a), 3}, JoinPart{bytes(b), 6}}, 2, 4, CopyRule::kFinite);
  EXPECT_TRUE(broken.empty());
  const std::vector<float> want = {100, 101, 102, 200, 201, 202, 203, 204, 205,
                                   103, 104, 105, 206, 207, 208, 209, 210, 211};
  EXPECT_EQ(out, want);
}

TEST(JoinChecked, NamesEveryPartThatBrokeTheRuleAndCopiesThemAll) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a = {0, 1}, b = {2, nan}, c = {4, 5}, d = {INFINITY, 7};
  std::vector<float> out(8, -1.0f);
  const auto broken = zrl::join_checked(
      reinterpret_cast<uint8_t*>(out.data()),
      {JoinPart{bytes(a), 2}, JoinPart{bytes(b), 2}, JoinPart{bytes(c), 2}, JoinPart{bytes(d), 2}}, 1, 4,
      CopyRule::kFinite);
  EXPECT_EQ(broken, (std::vector<std::size_t>{1, 3}));
  EXPECT_EQ(out[2], 2.0f);
  EXPECT_TRUE(std::isnan(out[3]));
  EXPECT_TRUE(std::isinf(out[6]));
  EXPECT_EQ(out[7], 7.0f);
}

TEST(JoinChecked, ABoundBrokenInAnyOuterRowBreaksThePart) {
  // Two rows of [2] and [1] int32 each; only the second row of the first part holds a 9.
  std::vector<int32_t> a = {1, 2, 3, 9}, b = {0, 1};
  std::vector<int32_t> out(6, -1);
  auto broken = zrl::join_checked(reinterpret_cast<uint8_t*>(out.data()), {JoinPart{bytes(a), 2}, JoinPart{bytes(b), 1}},
                                  2, 4, CopyRule::kBound, 5);
  EXPECT_EQ(broken, (std::vector<std::size_t>{0}));
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 0, 3, 9, 1}));
  broken = zrl::join_checked(reinterpret_cast<uint8_t*>(out.data()), {JoinPart{bytes(a), 2}, JoinPart{bytes(b), 1}}, 2,
                             4, CopyRule::kNone);
  EXPECT_TRUE(broken.empty());
}

TEST(JoinChecked, NothingToJoinAndBadItemSizes) {
  EXPECT_TRUE(zrl::join_checked(nullptr, {}, 3, 4, CopyRule::kFinite).empty());
  std::vector<int32_t> a = {1};
  std::vector<int32_t> out(1);
  EXPECT_THROW(zrl::join_checked(reinterpret_cast<uint8_t*>(out.data()), {JoinPart{bytes(a), 1}}, 1, 3, CopyRule::kNone),
               std::invalid_argument);
}

}  // namespace
