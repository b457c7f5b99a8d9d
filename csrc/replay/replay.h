// Replay buffers over ColumnStorage: PrioritizedReplay (Schaul et al. 2016,
// "Prioritized Experience Replay", proportional variant) and UniformReplay.
//
// PrioritizedReplay samples item i with probability P(i) = p_i^alpha /
// sum_k p_k^alpha, drawing one item per equal segment of the total
// (stratified, as in the paper), and returns importance weights
// w_i = (N * P(i))^-beta / max_k (N * P(k))^-beta = (min_k p_k^alpha / p_i^alpha)^beta,
// normalised by the largest weight any stored item could get (OpenAI
// Baselines' choice), so 0 < w_i <= 1. A new item gets the largest raw
// priority seen so far (initially 1, as in Baselines) unless the adder gives
// one. Priorities must be finite and > 0; p^alpha is stored as a float
// clamped to [FLT_MIN, FLT_MAX / 16] (the tree's range) so that no stored
// item has zero mass.
// Eviction is FIFO; keys carry a generation (see column_storage.h), so
// update_priorities silently skips items evicted since they were sampled.
//
// Concurrency contract. Every public method may be called from any thread at
// any time; each holds the buffer's one mutex for its critical section, so
// calls are atomic with respect to each other (the usual case: a receiver
// thread calling add while the learner thread calls sample and
// update_priorities). Work that needs no shared state runs outside the lock:
// checking priorities and raising them to alpha before, importance weights
// after. Under the lock: add copies the batch into storage and fixes the tree
// once per contiguous run of slots; sample descends the tree and gathers the
// items straight into the caller's buffers; update_priorities writes leaves.
// One lock rather than a tree lock and a storage lock: a sample must never
// gather a slot that an add is overwriting, and the sampler is one thread
// anyway, so a finer scheme would buy nothing. The code under the lock never
// calls out (no callbacks, no Python), so it cannot deadlock with the GIL:
// the bindings release the GIL before calling in.
//
// Errors: bad arguments throw std::invalid_argument naming the argument
// ("priorities: ...", "keys: ..."), checked before anything changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "replay/column_storage.h"
#include "replay/rng.h"
#include "replay/sum_min_tree.h"

namespace zrl {

// A prioritised buffer's full state, for checkpoints. scaled_priorities holds
// p^alpha as the tree stores it, [size], in slot order.
struct PrioritizedReplayState {
  std::size_t capacity = 0;
  double alpha = 0.0;
  double max_priority = 1.0;
  StorageState storage;
  std::vector<float> scaled_priorities;
  Xoshiro256pp::State rng_state{};
};

struct PrioritizedReplayStateView {
  std::size_t capacity = 0;
  double alpha = 0.0;
  double max_priority = 1.0;
  StorageStateView storage;
  const float* scaled_priorities = nullptr;  // [storage.size]
  Xoshiro256pp::State rng_state{};
};

class PrioritizedReplay {
 public:
  // alpha >= 0 and finite. Throws std::invalid_argument for bad arguments.
  PrioritizedReplay(std::size_t capacity, std::vector<FieldSpec> fields, double alpha,
                    uint64_t seed);

  // Set at construction and never changed: safe to read without the lock.
  std::size_t capacity() const { return storage_.capacity(); }
  const std::vector<FieldSpec>& fields() const { return storage_.fields(); }
  double alpha() const { return alpha_; }

  std::size_t size() const;
  double max_priority() const;

  // Appends n items. columns[f] points at n contiguous items of field f (in
  // fields() order). priorities: n raw priorities (finite, > 0), or nullptr
  // to give every item the largest priority seen so far.
  void add(const void* const* columns, std::size_t n, const double* priorities);

  // Draws n > 0 items (stratified, with replacement) with 0 <= beta <= 1.
  // Writes keys[n], weights[n] and out[f] (n items of field f each).
  // Throws std::invalid_argument when the buffer is empty.
  void sample(std::size_t n, double beta, int64_t* keys, float* weights, void* const* out);

  // Sets the priority of each item still stored; keys of evicted items are
  // skipped. Returns how many were applied. Throws std::invalid_argument for
  // a key never issued or a priority that is not finite and > 0.
  std::size_t update_priorities(const int64_t* keys, const double* priorities, std::size_t n);

  PrioritizedReplayState export_state() const;
  // Replaces the whole state; throws std::invalid_argument, changing nothing,
  // unless it matches this buffer (capacity, alpha, fields) and is consistent.
  void import_state(const PrioritizedReplayStateView& state);

  // For tests and debugging.
  double tree_total() const;
  float tree_min() const;
  std::vector<float> scaled_priorities() const;  // p^alpha of slots [0, size)
  bool check_invariants(std::string* error) const;

 private:
  float scale(double priority) const;  // p^alpha as stored

  const double alpha_;
  mutable std::mutex mu_;
  ColumnStorage storage_;      // guarded by mu_
  SumMinTree tree_;            // guarded by mu_
  Xoshiro256pp rng_;           // guarded by mu_
  double max_priority_ = 1.0;  // guarded by mu_
};

struct UniformReplayState {
  std::size_t capacity = 0;
  StorageState storage;
  Xoshiro256pp::State rng_state{};
};

struct UniformReplayStateView {
  std::size_t capacity = 0;
  StorageStateView storage;
  Xoshiro256pp::State rng_state{};
};

// Uniform sampling with replacement over the stored items, FIFO eviction.
// The same concurrency contract as PrioritizedReplay: one mutex, every
// method atomic.
class UniformReplay {
 public:
  UniformReplay(std::size_t capacity, std::vector<FieldSpec> fields, uint64_t seed);

  std::size_t capacity() const { return storage_.capacity(); }
  const std::vector<FieldSpec>& fields() const { return storage_.fields(); }
  std::size_t size() const;

  void add(const void* const* columns, std::size_t n);
  // Draws n > 0 items uniformly with replacement into out[f].
  void sample(std::size_t n, void* const* out);

  UniformReplayState export_state() const;
  void import_state(const UniformReplayStateView& state);

 private:
  mutable std::mutex mu_;
  ColumnStorage storage_;  // guarded by mu_
  Xoshiro256pp rng_;       // guarded by mu_
};

}  // namespace zrl
