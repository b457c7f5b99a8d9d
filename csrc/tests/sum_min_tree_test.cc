// GoogleTest of the 16-ary sum/min tree against brute force over the leaves:
// totals, minima, prefix search and stratified sampling, for capacities that
// are and are not powers of 16 (or of 2).
#include "replay/sum_min_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using zrl::SumMinTree;

const std::size_t kCapacities[] = {1, 2, 15, 16, 17, 100, 255, 256, 257, 1000, 4097, 70001};

double brute_total(const std::vector<float>& v) {
  double s = 0.0;
  for (float x : v) s += x;
  return s;
}

float brute_min(const std::vector<float>& v) {
  float m = std::numeric_limits<float>::infinity();
  for (float x : v)
    if (x > 0.0f) m = std::min(m, x);
  return m;
}

// The slot whose cumulative range [prefix, prefix + leaf) holds `mass`.
std::size_t brute_find(const std::vector<float>& v, double mass) {
  double prefix = 0.0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    prefix += v[i];
    if (mass < prefix) return i;
  }
  return v.size();
}

// Random leaves with some left empty, the rest spread over six decades.
std::vector<float> random_leaves(std::size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<float> v(n);
  for (float& x : v) x = unit(rng) < 0.2 ? 0.0f : float(std::pow(10.0, 6.0 * unit(rng) - 3.0));
  return v;
}

void set_all(SumMinTree& tree, const std::vector<float>& v) {
  std::vector<int64_t> slots(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) slots[i] = int64_t(i);
  tree.set(slots.data(), v.data(), v.size());
}

TEST(SumMinTree, EmptyTreeHasNoMassAndNoMinimum) {
  SumMinTree tree(37);
  EXPECT_EQ(tree.total(), 0.0);
  EXPECT_EQ(tree.min(), std::numeric_limits<float>::infinity());
  EXPECT_THROW(tree.find(0.0), std::invalid_argument);
  std::string why;
  EXPECT_TRUE(tree.check_invariants(&why)) << why;
}

TEST(SumMinTree, RejectsZeroCapacity) { EXPECT_THROW(SumMinTree(0), std::invalid_argument); }

TEST(SumMinTree, TotalAndMinMatchBruteForceForManyCapacities) {
  std::mt19937_64 rng(1);
  // The fixed edge cases, then random capacities.
  std::vector<std::size_t> capacities(std::begin(kCapacities), std::end(kCapacities));
  std::uniform_int_distribution<std::size_t> random_capacity(1, 200000);
  for (int i = 0; i < 8; ++i) capacities.push_back(random_capacity(rng));
  for (std::size_t capacity : capacities) {
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    SumMinTree tree(capacity);
    std::vector<float> leaves = random_leaves(capacity, rng);
    set_all(tree, leaves);
    EXPECT_NEAR(tree.total(), brute_total(leaves), 1e-6 * brute_total(leaves));
    EXPECT_EQ(tree.min(), brute_min(leaves));
    // Then a batch of scattered updates, some to the same slot twice.
    std::uniform_int_distribution<std::size_t> pick(0, capacity - 1);
    std::vector<int64_t> slots;
    std::vector<float> values;
    for (int i = 0; i < 300; ++i) {
      slots.push_back(int64_t(pick(rng)));
      values.push_back(random_leaves(1, rng)[0]);
      leaves[slots.back()] = values.back();
    }
    tree.set(slots.data(), values.data(), slots.size());
    EXPECT_NEAR(tree.total(), brute_total(leaves), 1e-6 * brute_total(leaves));
    EXPECT_EQ(tree.min(), brute_min(leaves));
    for (std::size_t i = 0; i < capacity; ++i) ASSERT_EQ(tree.leaf(i), leaves[i]);
    std::string why;
    EXPECT_TRUE(tree.check_invariants(&why)) << why;
  }
}

TEST(SumMinTree, RepeatedSlotKeepsItsLastValue) {
  SumMinTree tree(40);
  const int64_t slots[] = {7, 7, 7};
  const float values[] = {1.0f, 5.0f, 2.5f};
  tree.set(slots, values, 3);
  EXPECT_EQ(tree.leaf(7), 2.5f);
  EXPECT_EQ(tree.total(), 2.5);
  EXPECT_EQ(tree.min(), 2.5f);
}

TEST(SumMinTree, SetRangeMatchesSetAndFixesEveryAncestorOnce) {
  std::mt19937_64 rng(2);
  for (std::size_t capacity : kCapacities) {
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    SumMinTree by_range(capacity), by_slot(capacity);
    std::vector<float> leaves = random_leaves(capacity, rng);
    // Three ranges that cross node boundaries at every level.
    const std::size_t a = capacity / 3, b = 2 * capacity / 3;
    by_range.set_range(0, leaves.data(), a);
    by_range.set_range(a, leaves.data() + a, b - a);
    by_range.set_range(b, leaves.data() + b, capacity - b);
    set_all(by_slot, leaves);
    EXPECT_EQ(by_range.total(), by_slot.total());
    EXPECT_EQ(by_range.min(), by_slot.min());
    std::string why;
    EXPECT_TRUE(by_range.check_invariants(&why)) << why;
  }
}

TEST(SumMinTree, FindMatchesBruteForcePrefixSearch) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (std::size_t capacity : kCapacities) {
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    SumMinTree tree(capacity);
    std::vector<float> leaves = random_leaves(capacity, rng);
    leaves[capacity - 1] = 1.0f;  // never an empty tree
    set_all(tree, leaves);
    const double total = tree.total();
    std::vector<double> masses;
    for (int i = 0; i < 2000; ++i) masses.push_back(unit(rng) * total);
    std::vector<int64_t> slots(masses.size());
    std::vector<float> values(masses.size());
    tree.find_many(masses.data(), masses.size(), slots.data(), values.data());
    for (std::size_t i = 0; i < masses.size(); ++i) {
      const std::size_t want = brute_find(leaves, masses[i]);
      ASSERT_GT(values[i], 0.0f) << "returned an empty leaf";
      ASSERT_EQ(values[i], leaves[slots[i]]);
      if (std::size_t(slots[i]) != want) {
        // Allowed only within rounding of a boundary between the two slots
        // (groups of 16 leaves are summed in float).
        double prefix = 0.0;
        for (std::size_t s = 0; s < std::min<std::size_t>(slots[i], want) + 1; ++s)
          prefix += leaves[s];
        ASSERT_NEAR(masses[i], prefix, 1e-6 * total) << "mass " << masses[i];
      }
    }
  }
}

TEST(SumMinTree, NeverReturnsAnEmptyLeafEvenAtTheEnds) {
  SumMinTree tree(1000);
  const int64_t slots[] = {0, 500, 999};
  const float values[] = {0.0f, 3.0f, 0.0f};  // one non-empty leaf in the middle
  tree.set(slots, values, 3);
  const double total = tree.total();
  for (double mass : {0.0, 1e-300, total / 2, std::nextafter(total, 0.0), total, 2 * total, -1.0})
    EXPECT_EQ(tree.find(mass), 500u) << "mass " << mass;
}

TEST(SumMinTree, StratifiedSamplingDrawsOnePerSegment) {
  std::mt19937_64 rng(4);
  zrl::Xoshiro256pp xrng(5);
  for (std::size_t capacity : {17u, 1000u, 70001u}) {
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    SumMinTree tree(capacity);
    std::vector<float> leaves = random_leaves(capacity, rng);
    leaves[0] = 1.0f;
    set_all(tree, leaves);
    std::vector<double> prefix(capacity + 1, 0.0);
    for (std::size_t i = 0; i < capacity; ++i) prefix[i + 1] = prefix[i] + leaves[i];
    const double total = tree.total();
    for (std::size_t n : {1u, 7u, 64u, 512u}) {
      std::vector<int64_t> slots(n);
      std::vector<float> values(n);
      tree.sample_stratified(n, xrng, slots.data(), values.data());
      const double segment = total / double(n);
      for (std::size_t i = 0; i < n; ++i) {
        // The drawn slot's range must overlap segment i.
        const double lo = prefix[slots[i]], hi = prefix[slots[i] + 1];
        const double eps = 1e-9 * total;
        ASSERT_LE(lo, (i + 1) * segment + eps) << "draw " << i << " of " << n;
        ASSERT_GE(hi, i * segment - eps) << "draw " << i << " of " << n;
        ASSERT_GT(values[i], 0.0f);
      }
    }
  }
}

TEST(SumMinTree, SamplingFrequenciesFollowTheLeaves) {
  // 4 leaves with masses 1:2:3:4; 40,000 stratified draws in batches of 8.
  SumMinTree tree(4);
  const float values[] = {1.0f, 2.0f, 3.0f, 4.0f};
  tree.set_range(0, values, 4);
  zrl::Xoshiro256pp rng(6);
  std::vector<int> counts(4, 0);
  std::vector<int64_t> slots(8);
  std::vector<float> leaf(8);
  for (int b = 0; b < 5000; ++b) {
    tree.sample_stratified(8, rng, slots.data(), leaf.data());
    for (int64_t s : slots) ++counts[s];
  }
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(counts[i] / 40000.0, (i + 1) / 10.0, 0.01);
}

TEST(SumMinTree, RejectsBadSlotsAndValuesWithoutChangingAnything) {
  SumMinTree tree(20);
  const int64_t ok_slot[] = {3};
  const float ok_value[] = {2.0f};
  tree.set(ok_slot, ok_value, 1);
  const int64_t slots[] = {1, 20};
  const float values[] = {1.0f, 1.0f};
  EXPECT_THROW(tree.set(slots, values, 2), std::out_of_range);
  const int64_t negative_slot[] = {-1};
  EXPECT_THROW(tree.set(negative_slot, values, 1), std::out_of_range);
  const int64_t good[] = {1, 2};
  for (float bad : {-1.0f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(), SumMinTree::kMaxLeaf * 2}) {
    const float bad_values[] = {1.0f, bad};
    EXPECT_THROW(tree.set(good, bad_values, 2), std::invalid_argument);
    EXPECT_THROW(tree.set_range(0, bad_values, 2), std::invalid_argument);
  }
  EXPECT_THROW(tree.set_range(19, values, 2), std::out_of_range);
  EXPECT_EQ(tree.total(), 2.0);
  EXPECT_EQ(tree.leaf(1), 0.0f);
}

TEST(SumMinTree, ClearEmptiesEverything) {
  SumMinTree tree(300);
  std::vector<float> ones(300, 1.0f);
  tree.set_range(0, ones.data(), 300);
  tree.clear();
  EXPECT_EQ(tree.total(), 0.0);
  EXPECT_EQ(tree.min(), std::numeric_limits<float>::infinity());
  std::string why;
  EXPECT_TRUE(tree.check_invariants(&why)) << why;
}

}  // namespace
