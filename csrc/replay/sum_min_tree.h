// A 16-ary sum-tree and min-tree over one shared array of leaf priorities,
// for any capacity, with batched set and stratified sampling.
//
// Layout. Entries are grouped in aligned groups of 16 at every level. Level
// 0's entries are the leaves: one float per slot, padded with zeros to a
// multiple of 16. An entry of level l >= 1 stands for one group of level
// l - 1 and holds that group's sum (double) and minimum (float). Levels are
// padded to a multiple of 16 entries (sum 0, min +inf) and stop at the first
// level that is a single group; its sum is the total. For 1,000,000 slots
// the levels have 1,000,000 / 62,512 / 3,920 / 256 / 16 entries.
//
// Beside the values, every level keeps, per group, the inclusive prefix sums
// of the group's 16 values: float over the leaves (one cache line per group;
// 16 floats sum precisely enough in float), double above. A descent reads one
// prefix group per level and finds its child by a 4-step binary search
// (about 30 instructions, no floating-point adds); summing 16 children on the
// way down instead costs several times that, and descents are compute-bound
// once their memory is prefetched. The prefix arrays double the memory (9 MB
// in all for a million slots, small enough to live in L3); they are
// recomputed from the values, never patched with deltas.
//
// Why 16-ary: a binary tree over 2^20 leaves costs 20 dependent steps and
// several cache misses per descent; here it is 5 steps, and the top three
// levels stay in L1/L2. Why a shared leaf array: the min-tree needs no leaf
// copy, and one pass up the tree fixes both. Why double sums above the
// leaves: a float total of a million priorities near 1 has a granularity of
// 0.06, which would misplace small priorities.
//
// Leaf semantics. A leaf is in [0, kMaxLeaf]; 0 means "empty": it holds no
// mass (never sampled) and is ignored by the minimum. (kMaxLeaf is FLT_MAX /
// 16, so a group's float prefix sum cannot overflow.) Every internal value
// is a pure function of the leaves (recomputed, never patched), so
// check_invariants() can demand bit equality.
//
// Batched updates. set() and set_range() write the leaves, mark their groups
// dirty in a per-level bitset, and then fix the levels bottom-up, each dirty
// group once: 512 random updates of a million slots recompute about 1,200
// groups instead of 2,560 paths' worth, in address order.
//
// Sampling. find(mass) returns the slot whose cumulative range [prefix,
// prefix + leaf) contains `mass`; sample_stratified draws one mass per equal
// segment of the total. find_many runs up to kGroup descents in lock-step,
// one level at a time, prefetching each descent's next group, so the cache
// misses of different descents overlap instead of queueing.
//
// Concurrency: none inside. Reads (total, min, leaf, find*, sample*) may run
// concurrently with each other; set, set_range and clear need exclusive
// access. The replay buffers hold their mutex around every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "replay/aligned_array.h"
#include "replay/rng.h"

namespace zrl {

class SumMinTree {
 public:
  static constexpr std::size_t kFanout = 16;
  // Descents interleaved by find_many.
  static constexpr std::size_t kGroup = 32;
  static constexpr float kMaxLeaf = std::numeric_limits<float>::max() / 16;

  // All leaves start empty (0). Throws std::invalid_argument for capacity 0.
  explicit SumMinTree(std::size_t capacity);

  std::size_t capacity() const { return capacity_; }
  // Levels including the leaves (1 when capacity <= 16).
  std::size_t num_levels() const { return counts_.size(); }

  // leaves[slots[i]] = values[i] for i in [0, n), in order (a repeated slot
  // keeps its last value), then fixes every touched group once. Throws
  // std::out_of_range for a slot outside [0, capacity) and
  // std::invalid_argument for a value outside [0, kMaxLeaf] (or NaN); it
  // checks everything before changing anything.
  void set(const int64_t* slots, const float* values, std::size_t n);
  // leaves[first + i] = values[i] for i in [0, n); first + n <= capacity.
  // Same checks.
  void set_range(std::size_t first, const float* values, std::size_t n);
  // Empties every leaf.
  void clear();

  // Sum of all leaves (0 when all are empty).
  double total() const {
    return top() == 0 ? double(leaf_prefix_[kFanout - 1]) : prefix_[top()][kFanout - 1];
  }
  // Smallest non-empty leaf; +infinity when all are empty.
  float min() const { return root_min_; }
  float leaf(std::size_t slot) const { return leaves_[slot]; }
  const float* leaves() const { return leaves_.data(); }

  // The slot whose cumulative range contains `mass`, for 0 <= mass < total().
  // A mass outside that range is clamped into it; an empty leaf is never
  // returned. Throws std::invalid_argument when the tree is empty.
  std::size_t find(double mass) const;
  // An array indexed by slot (row r at base + r * row_bytes) that the caller
  // will read for every sampled slot. find_many prefetches its row as soon as
  // each descent lands, so the caller's gather finds it in cache; spread over
  // the descents, the prefetches never queue up behind each other.
  struct SlotRows {
    const void* base;
    std::size_t row_bytes;
  };

  // find() for n masses: slots[i] = find(masses[i]), leaf_values[i] = its leaf.
  void find_many(const double* masses, std::size_t n, int64_t* slots, float* leaf_values,
                 const std::vector<SlotRows>& rows = {}) const;
  // Stratified sampling: draw i lands uniformly in the i-th of n equal
  // segments of [0, total()), so every batch covers the whole distribution.
  // Writes slots[n] and their leaf_values[n]. Throws std::invalid_argument
  // when the tree is empty.
  void sample_stratified(std::size_t n, Xoshiro256pp& rng, int64_t* slots, float* leaf_values,
                         const std::vector<SlotRows>& rows = {}) const;

  // Recomputes every internal value from the leaves and compares bit for bit.
  // Returns false and says where in *error when something disagrees.
  bool check_invariants(std::string* error) const;

 private:
  std::size_t top() const { return counts_.size() - 1; }
  void mark_dirty(std::size_t level, std::size_t group);
  void fix_dirty();
  void fix_group(std::size_t level, std::size_t group);

  std::size_t capacity_;
  std::vector<std::size_t> counts_;  // entries per level, multiples of 16
  AlignedArray<float> leaves_;       // level 0 values
  AlignedArray<float> leaf_prefix_;  // level 0 prefix sums
  // Per level l >= 1: the values sums_[l] and mins_[l], and their prefix
  // sums prefix_[l]. Index 0 is unused.
  std::vector<AlignedArray<double>> prefix_;
  std::vector<AlignedArray<double>> sums_;
  std::vector<AlignedArray<float>> mins_;
  float root_min_;
  // Per level: one bit per group that set() has touched and not yet fixed.
  std::vector<std::vector<uint64_t>> dirty_;
  std::vector<std::size_t> dirty_lo_, dirty_hi_;  // word range to sweep
};

}  // namespace zrl
