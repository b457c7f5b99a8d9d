// GoogleTest of the replay buffers: storage round trips, FIFO eviction, the
// generation rule for stale keys, importance weights, checkpoint state, and
// concurrent add / sample / update from several std::threads.
#include "replay/replay.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using zrl::DType;
using zrl::FieldSpec;
using zrl::PrioritizedReplay;
using zrl::UniformReplay;

// Two fields: id (int64 scalar) and obs (float32 [3], obs = id + {0, .25, .5}),
// so a sampled item can be checked against its own id.
std::vector<FieldSpec> id_fields() {
  return {FieldSpec{"id", {}, DType::kInt64}, FieldSpec{"obs", {3}, DType::kFloat32}};
}

struct Batch {
  std::vector<int64_t> id;
  std::vector<float> obs;
  explicit Batch(std::size_t n = 0) : id(n), obs(3 * n) {}
  static Batch ids(int64_t first, std::size_t n) {
    Batch b(n);
    for (std::size_t i = 0; i < n; ++i) {
      b.id[i] = first + int64_t(i);
      for (int k = 0; k < 3; ++k) b.obs[3 * i + k] = float(b.id[i]) + 0.25f * k;
    }
    return b;
  }
  std::vector<const void*> in() const { return {id.data(), obs.data()}; }
  std::vector<void*> out() { return {id.data(), obs.data()}; }
  void expect_consistent() const {
    for (std::size_t i = 0; i < id.size(); ++i)
      for (int k = 0; k < 3; ++k) ASSERT_EQ(obs[3 * i + k], float(id[i]) + 0.25f * k);
  }
};

struct Sampled {
  std::vector<int64_t> keys;
  std::vector<float> weights;
  Batch batch;
  explicit Sampled(std::size_t n) : keys(n), weights(n), batch(n) {}
};

Sampled sample(PrioritizedReplay& rb, std::size_t n, double beta) {
  Sampled s(n);
  auto out = s.batch.out();
  rb.sample(n, beta, s.keys.data(), s.weights.data(), out.data());
  return s;
}

void add(PrioritizedReplay& rb, const Batch& b, const std::vector<double>* priorities = nullptr) {
  auto in = b.in();
  rb.add(in.data(), b.id.size(), priorities ? priorities->data() : nullptr);
}

TEST(PrioritizedReplay, SampledItemsAreStoredItems) {
  PrioritizedReplay rb(100, id_fields(), 0.6, 1);
  add(rb, Batch::ids(0, 70));
  EXPECT_EQ(rb.size(), 70u);
  Sampled s = sample(rb, 256, 0.4);
  s.batch.expect_consistent();
  for (std::size_t i = 0; i < 256; ++i) {
    ASSERT_GE(s.batch.id[i], 0);
    ASSERT_LT(s.batch.id[i], 70);
    EXPECT_EQ(s.keys[i], s.batch.id[i]);  // first generation: key = slot = id
  }
}

TEST(PrioritizedReplay, EvictsFirstInFirstOut) {
  PrioritizedReplay rb(5, id_fields(), 1.0, 2);
  add(rb, Batch::ids(0, 3));
  add(rb, Batch::ids(3, 4));  // wraps: ids 5 and 6 overwrite slots 0 and 1
  EXPECT_EQ(rb.size(), 5u);
  std::set<int64_t> seen;
  Sampled s = sample(rb, 500, 1.0);
  s.batch.expect_consistent();
  for (int64_t id : s.batch.id) seen.insert(id);
  EXPECT_EQ(seen, (std::set<int64_t>{2, 3, 4, 5, 6}));
  // A batch larger than the capacity keeps its last `capacity` items.
  add(rb, Batch::ids(100, 12));
  seen.clear();
  s = sample(rb, 500, 1.0);
  for (int64_t id : s.batch.id) seen.insert(id);
  EXPECT_EQ(seen, (std::set<int64_t>{107, 108, 109, 110, 111}));
  std::string why;
  EXPECT_TRUE(rb.check_invariants(&why)) << why;
}

TEST(PrioritizedReplay, KeysOfOverwrittenSlotsAreIgnored) {
  PrioritizedReplay rb(4, id_fields(), 1.0, 3);
  add(rb, Batch::ids(0, 4));
  Sampled old = sample(rb, 64, 0.5);
  add(rb, Batch::ids(4, 2));  // evicts ids 0 and 1 (slots 0 and 1)
  std::vector<double> big(64, 1000.0);
  const std::size_t applied = rb.update_priorities(old.keys.data(), big.data(), 64);
  std::size_t fresh = 0;
  for (int64_t id : old.batch.id) fresh += id >= 2;
  EXPECT_EQ(applied, fresh);
  const std::vector<float> leaves = rb.scaled_priorities();
  // New items in slots 0 and 1 keep the max priority at the time they were
  // added (1); survivors that were sampled got 1000.
  EXPECT_EQ(leaves[0], 1.0f);
  EXPECT_EQ(leaves[1], 1.0f);
  // Keys are (generation << 32) | slot: ids 4 and 5 overwrote slots 0 and 1.
  Sampled now = sample(rb, 64, 0.5);
  for (std::size_t i = 0; i < 64; ++i) {
    const int64_t id = now.batch.id[i];
    EXPECT_EQ(now.keys[i], ((id / 4) << 32) | (id % 4));
  }
}

TEST(PrioritizedReplay, RejectsKeysItNeverIssued) {
  PrioritizedReplay rb(8, id_fields(), 1.0, 4);
  add(rb, Batch::ids(0, 5));
  const double p[] = {2.0};
  for (int64_t bad : {int64_t{-1}, int64_t{5}, int64_t{7}, int64_t{1} << 32, int64_t{1} << 40}) {
    EXPECT_THROW(rb.update_priorities(&bad, p, 1), std::invalid_argument) << bad;
  }
  // A bad key anywhere in the batch changes nothing.
  const int64_t keys[] = {0, 99};
  const double ps[] = {5.0, 5.0};
  EXPECT_THROW(rb.update_priorities(keys, ps, 2), std::invalid_argument);
  EXPECT_EQ(rb.scaled_priorities()[0], 1.0f);
}

TEST(PrioritizedReplay, NewItemsGetTheLargestPrioritySeen) {
  PrioritizedReplay rb(10, id_fields(), 0.5, 5);
  add(rb, Batch::ids(0, 2));
  EXPECT_EQ(rb.max_priority(), 1.0);
  const int64_t keys[] = {0};
  const double p[] = {16.0};
  rb.update_priorities(keys, p, 1);
  add(rb, Batch::ids(2, 1));
  EXPECT_FLOAT_EQ(rb.scaled_priorities()[2], 4.0f);  // 16^0.5
  std::vector<double> given{0.25};
  add(rb, Batch::ids(3, 1), &given);
  EXPECT_FLOAT_EQ(rb.scaled_priorities()[3], 0.5f);
  EXPECT_EQ(rb.max_priority(), 16.0);
}

TEST(PrioritizedReplay, WeightsAreNormalisedImportanceWeights) {
  const double alpha = 0.7, beta = 0.4;
  PrioritizedReplay rb(6, id_fields(), alpha, 6);
  std::vector<double> p{0.5, 1.0, 2.0, 3.0, 8.0};
  add(rb, Batch::ids(0, 5), &p);
  Sampled s = sample(rb, 200, beta);
  double total = 0.0, pmin = 1e300;
  for (double x : p) {
    total += std::pow(x, alpha);
    pmin = std::min(pmin, std::pow(x, alpha));
  }
  const double n = 5.0, max_w = std::pow(n * pmin / total, -beta);
  for (std::size_t i = 0; i < 200; ++i) {
    const double prob = std::pow(p[s.batch.id[i]], alpha) / total;
    EXPECT_NEAR(s.weights[i], std::pow(n * prob, -beta) / max_w, 1e-5);
    EXPECT_LE(s.weights[i], 1.0f);
  }
}

TEST(PrioritizedReplay, RejectsBadArguments) {
  EXPECT_THROW(PrioritizedReplay(0, id_fields(), 0.6, 0), std::invalid_argument);
  EXPECT_THROW(PrioritizedReplay(4, id_fields(), -0.1, 0), std::invalid_argument);
  EXPECT_THROW(PrioritizedReplay(4, {}, 0.6, 0), std::invalid_argument);
  EXPECT_THROW(PrioritizedReplay(4, {FieldSpec{"a", {0}, DType::kUInt8}}, 0.6, 0),
               std::invalid_argument);
  EXPECT_THROW(
      PrioritizedReplay(4, {FieldSpec{"a", {}, DType::kUInt8}, FieldSpec{"a", {}, DType::kBool}},
                        0.6, 0),
      std::invalid_argument);
  PrioritizedReplay rb(4, id_fields(), 0.6, 7);
  Sampled s(1);
  auto out = s.batch.out();
  EXPECT_THROW(rb.sample(1, 0.4, s.keys.data(), s.weights.data(), out.data()),
               std::invalid_argument);  // empty
  add(rb, Batch::ids(0, 2));
  EXPECT_THROW(rb.sample(0, 0.4, s.keys.data(), s.weights.data(), out.data()),
               std::invalid_argument);
  EXPECT_THROW(rb.sample(1, 1.5, s.keys.data(), s.weights.data(), out.data()),
               std::invalid_argument);
  for (double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    std::vector<double> p{1.0, bad};
    EXPECT_THROW(add(rb, Batch::ids(0, 2), &p), std::invalid_argument);
    const int64_t keys[] = {0, 1};
    EXPECT_THROW(rb.update_priorities(keys, p.data(), 2), std::invalid_argument);
  }
  EXPECT_EQ(rb.size(), 2u);
}

TEST(PrioritizedReplay, ExtremePrioritiesAreClampedIntoTheTreesRange) {
  for (double alpha : {0.5, 1.0, 3.0}) {
    PrioritizedReplay rb(40, id_fields(), alpha, 12);
    std::vector<double> p{1e-300, 1e-40, 1e-3, 1.0, 1e30, 1e300, 5.0, 7.0};
    add(rb, Batch::ids(0, 8), &p);
    for (float leaf : rb.scaled_priorities()) {
      EXPECT_GE(leaf, std::numeric_limits<float>::min());
      EXPECT_LE(leaf, zrl::SumMinTree::kMaxLeaf);
    }
    Sampled s = sample(rb, 64, 1.0);
    s.batch.expect_consistent();
    // A weight may underflow to 0 (1e-40 against 1e300), never exceed 1.
    for (float w : s.weights) EXPECT_TRUE(w >= 0.0f && w <= 1.0f) << w;
    std::string why;
    EXPECT_TRUE(rb.check_invariants(&why)) << why;
    EXPECT_TRUE(std::isfinite(rb.tree_total()));
  }
}

TEST(PrioritizedReplay, StateRoundTripsAndResumesTheSameSamples) {
  PrioritizedReplay a(7, id_fields(), 0.6, 8);
  add(a, Batch::ids(0, 10));  // wrapped: cursor 3, generations 1,1,1,0,0,0,0
  Sampled s = sample(a, 16, 0.4);
  std::vector<double> p(16);
  for (std::size_t i = 0; i < 16; ++i) p[i] = 0.1 + double(i);
  a.update_priorities(s.keys.data(), p.data(), 16);
  zrl::PrioritizedReplayState st = a.export_state();
  EXPECT_EQ(st.storage.size, 7u);
  EXPECT_EQ(st.storage.cursor, 3u);

  PrioritizedReplay b(7, id_fields(), 0.6, 999);
  zrl::PrioritizedReplayStateView view;
  view.capacity = st.capacity;
  view.alpha = st.alpha;
  view.max_priority = st.max_priority;
  view.storage.size = st.storage.size;
  view.storage.cursor = st.storage.cursor;
  for (auto& c : st.storage.columns) view.storage.columns.push_back(c.data());
  view.storage.generations = st.storage.generations.data();
  view.scaled_priorities = st.scaled_priorities.data();
  view.rng_state = st.rng_state;
  b.import_state(view);
  EXPECT_EQ(b.scaled_priorities(), a.scaled_priorities());
  EXPECT_EQ(b.max_priority(), a.max_priority());
  Sampled sa = sample(a, 32, 0.4), sb = sample(b, 32, 0.4);
  EXPECT_EQ(sa.keys, sb.keys);
  EXPECT_EQ(sa.batch.id, sb.batch.id);
  EXPECT_EQ(sa.weights, sb.weights);

  // Inconsistent states are refused and leave the buffer as it was.
  auto refused = [&](auto mutate) {
    zrl::PrioritizedReplayStateView bad = view;
    std::vector<int64_t> generations = st.storage.generations;
    std::vector<float> scaled = st.scaled_priorities;
    bad.storage.generations = generations.data();
    bad.scaled_priorities = scaled.data();
    mutate(bad, generations, scaled);
    EXPECT_THROW(b.import_state(bad), std::invalid_argument);
  };
  refused([](auto& v, auto&, auto&) { v.capacity = 8; });
  refused([](auto& v, auto&, auto&) { v.alpha = 0.5; });
  refused([](auto& v, auto&, auto&) { v.storage.size = 8; });
  refused([](auto& v, auto&, auto&) { v.storage.cursor = 7; });
  refused([](auto&, auto& g, auto&) { g[5] = 3; });
  refused([](auto&, auto&, auto& s) { s[2] = 0.0f; });
  refused([](auto& v, auto&, auto&) { v.max_priority = -1.0; });
  refused([](auto& v, auto&, auto&) { v.rng_state = {0, 0, 0, 0}; });
  refused([](auto&, auto& g, auto&) { std::fill(g.begin(), g.end(), INT64_MAX); });  // g + 1 would overflow
  EXPECT_EQ(b.scaled_priorities(), a.scaled_priorities());

  // Generations past 2^31 (a slot overwritten that often): keys keep 31 bits, so once a
  // slot's counter wraps, a key of the generation before it reads as "newer". It is stale,
  // skipped like any other, not refused as never issued.
  std::vector<int64_t> late(7, (int64_t{1} << 31) - 1);
  for (std::size_t i = 0; i < 3; ++i) late[i] = int64_t{1} << 31;  // before the cursor: one more
  zrl::PrioritizedReplayStateView old = view;
  old.storage.generations = late.data();
  b.import_state(old);
  Sampled before = sample(b, 64, 0.4);  // keys of slot 3 carry generation 2^31 - 1
  ASSERT_NE(std::find(before.batch.id.begin(), before.batch.id.end(), 3), before.batch.id.end());
  add(b, Batch::ids(100, 101));  // overwrites slot 3: its counter reaches 2^31, 0 in a key
  std::vector<double> ones(64, 1.0);
  EXPECT_NO_THROW(b.update_priorities(before.keys.data(), ones.data(), 64));
  std::string why;
  EXPECT_TRUE(b.check_invariants(&why)) << why;
}

TEST(PrioritizedReplay, ConcurrentAddSampleAndUpdateKeepTheTreeConsistent) {
  PrioritizedReplay rb(1000, id_fields(), 0.6, 9);
  add(rb, Batch::ids(0, 64));
  std::atomic<bool> stop{false};
  std::atomic<int64_t> next_id{64};
  std::vector<std::thread> adders;
  for (int t = 0; t < 2; ++t) {
    adders.emplace_back([&, t] {
      std::vector<double> p(37);
      for (int round = 0; round < 300; ++round) {
        Batch b = Batch::ids(next_id.fetch_add(37), 37);
        for (std::size_t i = 0; i < p.size(); ++i) p[i] = 0.5 + double((round + i + t) % 7);
        add(rb, b, round % 2 ? &p : nullptr);
      }
    });
  }
  std::thread learner([&] {
    std::vector<double> p(128);
    int rounds = 0;
    while (!stop.load() || rounds < 50) {
      Sampled s = sample(rb, 128, 0.4);
      s.batch.expect_consistent();  // never a torn item
      for (std::size_t i = 0; i < p.size(); ++i) p[i] = 0.01 + double((i * 31 + rounds) % 100);
      rb.update_priorities(s.keys.data(), p.data(), p.size());
      ++rounds;
    }
  });
  for (auto& t : adders) t.join();
  stop = true;
  learner.join();
  EXPECT_EQ(rb.size(), 1000u);
  std::string why;
  EXPECT_TRUE(rb.check_invariants(&why)) << why;
  const std::vector<float> leaves = rb.scaled_priorities();
  const double sum = std::accumulate(leaves.begin(), leaves.end(), 0.0);
  EXPECT_NEAR(rb.tree_total(), sum, 1e-6 * sum);  // groups of 16 leaves sum in float
  EXPECT_EQ(rb.tree_min(), *std::min_element(leaves.begin(), leaves.end()));
}

TEST(UniformReplay, SamplesOnlyStoredItemsUniformly) {
  UniformReplay rb(50, id_fields(), 10);
  Batch b = Batch::ids(0, 80);  // ids 30..79 remain
  auto in = b.in();
  rb.add(in.data(), 80);
  EXPECT_EQ(rb.size(), 50u);
  Batch s(20000);
  auto out = s.out();
  rb.sample(20000, out.data());
  s.expect_consistent();
  std::map<int64_t, int> counts;
  for (int64_t id : s.id) ++counts[id];
  EXPECT_EQ(counts.size(), 50u);
  EXPECT_EQ(counts.begin()->first, 30);
  for (auto& [id, c] : counts) EXPECT_NEAR(c, 400, 100) << id;  // ~5 sigma
}

TEST(UniformReplay, RejectsEmptyAndZeroSizedSamples) {
  UniformReplay rb(5, id_fields(), 11);
  Batch s(1);
  auto out = s.out();
  EXPECT_THROW(rb.sample(1, out.data()), std::invalid_argument);
  Batch b = Batch::ids(0, 1);
  auto in = b.in();
  rb.add(in.data(), 1);
  EXPECT_THROW(rb.sample(0, out.data()), std::invalid_argument);
}

TEST(UniformReplay, ConcurrentAddAndSampleNeverTearAnItem) {
  UniformReplay rb(300, id_fields(), 12);
  Batch first = Batch::ids(0, 10);
  auto in0 = first.in();
  rb.add(in0.data(), 10);
  std::atomic<bool> stop{false};
  std::thread adder([&] {
    for (int round = 0; round < 400; ++round) {
      Batch b = Batch::ids(10 + round * 13, 13);
      auto in = b.in();
      rb.add(in.data(), 13);
    }
    stop = true;
  });
  int rounds = 0;
  while (!stop.load() || rounds < 20) {
    Batch s(64);
    auto out = s.out();
    rb.sample(64, out.data());
    s.expect_consistent();
    ++rounds;
  }
  adder.join();
  EXPECT_EQ(rb.size(), 300u);
}

}  // namespace
