// Where a sampled batch's arrays lie when every field shares one block.
//
// zrl._core's sample returns a dict of [n, *shape] arrays, all views into one
// new block: one allocation instead of one per field, and a block of 4 MB or
// more is one numpy puts on huge pages, so a batch of Atari frames costs a few
// page faults rather than thousands (faulting in fresh output pages was most of
// such a sample).
#pragma once

#include <cstddef>
#include <vector>

#include "replay/column_storage.h"

namespace zrl {

inline constexpr std::size_t kBatchAlign = 64;  // each field's array starts at a multiple of this

struct BatchLayout {
  std::vector<std::size_t> offsets;  // of each field's [n, *shape] array, from an aligned block start
  std::size_t bytes = 0;             // the block's size: every array, each padded to kBatchAlign
};

// The fields' arrays of n items each, in field order, one after another.
BatchLayout batch_layout(const std::vector<FieldSpec>& fields, std::size_t n);

}  // namespace zrl
