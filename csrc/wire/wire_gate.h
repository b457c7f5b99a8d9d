// FrameGate: the learner's per-message check of a trajectory frame, in one call.
//
// zrl/protocol's `decode`, the algorithm's schema and its rules are the
// reference: they give every rejection its reason. They cost ~5 us of Python
// per message, which is most of the receiver's time for small chunks. But an
// actor sends the same layout over and over: the same arrays, dtypes, shapes
// and offsets, so the same descriptor block. Once Python has accepted a frame,
// it registers that block here with the value bounds its algorithm imposes
// (e.g. action < n, final_index < T * K), and the gate checks later frames
// with that block itself:
//
//   - the header, as decode does: length <= max_bytes, magic, protocol
//     version, kind (the one kind the gate serves), total length == frame
//     length, flags == 0, the descriptors and meta inside the frame;
//   - the descriptor block, byte for byte against the registered ones;
//   - that the arrays lie after the meta and inside the frame;
//   - every bound: each element, read as unsigned, is < bound (so a negative
//     signed value fails too);
//   - every finite rule: a floating-point array (float16, float32 or float64)
//     holds no NaN and no infinity (one such value in a reward turns every
//     weight NaN at the next update);
//   - every marks rule: an int32 index array lists, in increasing order, exactly
//     the positions where a flag array (bytes) is non-zero, and a second flag
//     array is zero at each of them (IMPALA: final_index names each truncated
//     step, and none of them is also terminated).
//
// The gate only ever vouches: a frame it does not accept (unknown block, or
// any check failing) goes to the Python path, which rejects it with a reason
// or accepts and registers it. So it can never accept what Python would not,
// and it never has to explain a rejection.
//
// Not thread-safe: one receiver thread owns a gate (add/clear/check).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zrl {

struct GateBound {
  uint64_t offset = 0;  // of the array, from the frame's start
  uint64_t count = 0;   // elements
  uint32_t itemsize = 0;  // 1, 2, 4 or 8
  uint64_t bound = 0;   // every element, as unsigned, must be < bound
};

struct GateFinite {
  uint64_t offset = 0;    // of the array, from the frame's start
  uint64_t count = 0;     // elements
  uint32_t itemsize = 0;  // 2, 4 or 8: IEEE half, single or double
};

struct GateMarks {
  uint64_t index_offset = 0;     // int32 positions, from the frame's start
  uint64_t index_count = 0;
  uint64_t marked_offset = 0;    // flags_count bytes: index lists where these are non-zero ...
  uint64_t excluded_offset = 0;  // ... and these are zero there
  uint64_t flags_count = 0;
};

struct GateResult {
  int layout = -1;  // >= 0: accepted, with that registered layout; -1: not vouched for
  uint32_t sender_id = 0;
  uint64_t seq = 0;
  uint64_t policy_version = 0;
  uint64_t meta_offset = 0;
  uint32_t meta_len = 0;
};

class FrameGate {
 public:
  static constexpr std::size_t kMaxLayouts = 64;

  // kind: the message kind served (TRAJECTORY); max_bytes: the receiver's cap.
  FrameGate(uint16_t kind, uint64_t max_bytes);

  // Registers a descriptor block (80 bytes per array) that Python accepted, the
  // byte range its arrays span, and the value bounds; returns the layout's id: the
  // next free slot, or, once all kMaxLayouts are taken, the slots in turn (the
  // caller forgets the layout it held). Throws std::invalid_argument for a
  // malformed block or bound. A sender's stream has one layout per (K, M) seen,
  // and `check` scans them in order, so a handful is the usual case.
  int add(const std::string& block, uint64_t first, uint64_t end, const std::vector<GateBound>& bounds,
          const std::vector<GateMarks>& marks = {}, const std::vector<GateFinite>& finite = {});
  void clear();
  std::size_t size() const { return layouts_.size(); }

  GateResult check(const uint8_t* data, std::size_t n) const;

 private:
  struct Layout {
    std::string block;
    uint64_t first = 0, end = 0;
    std::vector<GateBound> bounds;
    std::vector<GateMarks> marks;
    std::vector<GateFinite> finite;
  };
  uint16_t kind_;
  uint64_t max_bytes_;
  std::vector<Layout> layouts_;
  std::size_t next_ = 0;  // the slot replaced next once the table is full
};

// A gate rule applied while copying, for rules a receiver leaves to the batch join
// (a learner reads every byte of a chunk once more when it joins it into a batch, so
// checking there costs the receiver's thread no pass over the data; see
// Gate.set_trajectory_schema's leave_to_join):
// copies count elements of itemsize bytes (1, 2, 4 or 8) from src to dst and returns
// whether every one holds the rule: kNone (always), kFinite (itemsize 2, 4 or 8: IEEE
// half, single or double, no NaN and no infinity) or kBound (each element, read as
// unsigned, < bound). The whole array is copied either way. dst and src must not overlap.
enum class CopyRule : int { kNone = 0, kFinite = 1, kBound = 2 };
bool copy_checked(uint8_t* dst, const uint8_t* src, uint64_t count, uint32_t itemsize, CopyRule rule,
                  uint64_t bound = 0);

}  // namespace zrl
