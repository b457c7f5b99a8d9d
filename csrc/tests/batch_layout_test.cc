// GoogleTest of where a sampled batch's arrays lie in their shared block (replay/batch_layout.h).
#include "replay/batch_layout.h"

#include <gtest/gtest.h>

#include <vector>

namespace {

using zrl::DType;
using zrl::FieldSpec;

TEST(BatchLayout, EachFieldStartsAlignedRightAfterThePreviousOne) {
  const std::vector<FieldSpec> fields = {FieldSpec{"obs", {4, 84, 84}, DType::kUInt8},
                                         FieldSpec{"action", {}, DType::kInt64},
                                         FieldSpec{"done", {}, DType::kBool},
                                         FieldSpec{"q", {3}, DType::kFloat32}};
  const zrl::BatchLayout layout = zrl::batch_layout(fields, 5);
  // obs 5 x 28224 = 141120 (a multiple of 64), action 40 -> 64, done 5 -> 64, q 60 -> 64.
  EXPECT_EQ(layout.offsets, (std::vector<std::size_t>{0, 141120, 141184, 141248}));
  EXPECT_EQ(layout.bytes, 141312u);
  for (std::size_t off : layout.offsets) EXPECT_EQ(off % zrl::kBatchAlign, 0u);
}

TEST(BatchLayout, NoItemsOrNoFieldsTakeNoBytes) {
  const std::vector<FieldSpec> fields = {FieldSpec{"a", {2}, DType::kFloat32}, FieldSpec{"b", {}, DType::kInt64}};
  const zrl::BatchLayout empty = zrl::batch_layout(fields, 0);
  EXPECT_EQ(empty.offsets, (std::vector<std::size_t>{0, 0}));
  EXPECT_EQ(empty.bytes, 0u);
  EXPECT_TRUE(zrl::batch_layout({}, 7).offsets.empty());
  EXPECT_EQ(zrl::batch_layout({}, 7).bytes, 0u);
}

}  // namespace
