// The learner's batch join with the gate's value rules applied as it copies.
//
// A receiver may leave some of a chunk's rules (finite floats, bounds) to the
// batch join: the learner reads every byte of a chunk once more when it joins
// it into a batch, so checking there costs the receiver's thread no pass over
// the data (see Gate.set_trajectory_schema's leave_to_join). zrl._core.join_checked
// checks the arrays' shapes and dtypes, then calls this without the GIL.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "wire/wire_gate.h"

namespace zrl {

// One C-contiguous array to join: `count` elements per outer step (its extent
// along the join axis times the elements of each step of that axis).
struct JoinPart {
  const uint8_t* data = nullptr;
  uint64_t count = 0;
};

// Joins the parts into dst along one axis of C-order arrays of itemsize-byte
// elements (1, 2, 4 or 8): dst holds `outer` rows (the product of the dims
// before the axis), each the parts' rows one after another. Every element is
// checked by `rule` as it is copied (copy_checked). Returns the indices of the
// parts that broke the rule, in order; every part is copied regardless. dst must
// not overlap a part. Throws std::invalid_argument where copy_checked does.
std::vector<std::size_t> join_checked(uint8_t* dst, const std::vector<JoinPart>& parts, uint64_t outer,
                                      uint32_t itemsize, CopyRule rule, uint64_t bound = 0);

}  // namespace zrl
