// PrioritizedReplay and UniformReplay. See replay.h for the semantics and the
// locking contract; the storage and the tree do the work.
#include "replay/replay.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace zrl {
namespace {

constexpr float kMinScaled = std::numeric_limits<float>::min();  // smallest normal
constexpr float kMaxScaled = SumMinTree::kMaxLeaf;

void check_priorities(const double* priorities, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (!(priorities[i] > 0.0) || !std::isfinite(priorities[i]))
      throw std::invalid_argument("priorities: must be finite and > 0, got " +
                                  std::to_string(priorities[i]) + " at index " + std::to_string(i));
}

void check_rng_state(const Xoshiro256pp::State& s) {
  if (s[0] == 0 && s[1] == 0 && s[2] == 0 && s[3] == 0)
    throw std::invalid_argument("state: rng_state is all zero");
}

}  // namespace

// ---------------------------------------------------------------------------
// PrioritizedReplay

PrioritizedReplay::PrioritizedReplay(std::size_t capacity, std::vector<FieldSpec> fields,
                                     double alpha, uint64_t seed)
    : alpha_(alpha), storage_(capacity, std::move(fields)), tree_(capacity), rng_(seed) {
  if (!(alpha >= 0.0) || !std::isfinite(alpha))
    throw std::invalid_argument("alpha: must be finite and >= 0");
}

float PrioritizedReplay::scale(double priority) const {
  double scaled;
  if (priority >= double(kMinScaled) && priority <= double(kMaxScaled)) {
    // powf: the leaves are float anyway, and it is ~3x faster than pow.
    scaled = alpha_ == 1.0 ? priority : std::pow(float(priority), float(alpha_));
  } else {
    scaled = std::pow(priority, alpha_);  // beyond float range
  }
  return static_cast<float>(std::clamp(scaled, double(kMinScaled), double(kMaxScaled)));
}

std::size_t PrioritizedReplay::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return storage_.size();
}

double PrioritizedReplay::max_priority() const {
  std::lock_guard<std::mutex> lock(mu_);
  return max_priority_;
}

void PrioritizedReplay::add(const void* const* columns, std::size_t n, const double* priorities) {
  if (n == 0) return;
  std::vector<float> scaled(n);
  double batch_max = 0.0;
  if (priorities) {
    check_priorities(priorities, n);
    for (std::size_t i = 0; i < n; ++i) {
      scaled[i] = scale(priorities[i]);
      batch_max = std::max(batch_max, priorities[i]);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (priorities) {
    max_priority_ = std::max(max_priority_, batch_max);
  } else {
    std::fill(scaled.begin(), scaled.end(), scale(max_priority_));
  }
  // Split at the wrap so that each piece is one contiguous run of slots.
  for (std::size_t row = 0; row < n;) {
    const std::size_t first = storage_.cursor();
    const std::size_t run = std::min(n - row, capacity() - first);
    storage_.write(columns, row, run);
    tree_.set_range(first, scaled.data() + row, run);
    row += run;
  }
}

void PrioritizedReplay::sample(std::size_t n, double beta, int64_t* keys, float* weights,
                               void* const* out) {
  if (n == 0) throw std::invalid_argument("batch_size: must be positive");
  if (!(beta >= 0.0 && beta <= 1.0)) throw std::invalid_argument("beta: must be in [0, 1]");
  float min_scaled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (storage_.size() == 0)
      throw std::invalid_argument("batch_size: cannot sample from an empty buffer");
    // keys and weights hold the slots and their p^alpha until the end. The
    // descents prefetch each sampled row, so the gather mostly finds them in
    // cache.
    tree_.sample_stratified(n, rng_, keys, weights, storage_.slot_rows());
    storage_.gather(keys, n, out);
    for (std::size_t i = 0; i < n; ++i)
      keys[i] = storage_.key_of(static_cast<std::size_t>(keys[i]));
    min_scaled = tree_.min();
  }
  // (N P(i))^-beta / (N P_min)^-beta = (p_min / p_i)^beta: N and the total
  // cancel. powf unless the ratio underflows float (extreme priorities), where
  // a weight can still be representable after the power.
  const float b = static_cast<float>(beta);
  for (std::size_t i = 0; i < n; ++i) {
    const double ratio = double(min_scaled) / double(weights[i]);
    const double w = beta == 0.0                                  ? 1.0
                     : ratio >= std::numeric_limits<float>::min() ? std::pow(float(ratio), b)
                                                                  : std::pow(ratio, beta);
    weights[i] = static_cast<float>(std::min(w, 1.0));
  }
}

std::size_t PrioritizedReplay::update_priorities(const int64_t* keys, const double* priorities,
                                                 std::size_t n) {
  check_priorities(priorities, n);
  std::vector<float> scaled(n);
  for (std::size_t i = 0; i < n; ++i) scaled[i] = scale(priorities[i]);
  std::vector<int64_t> slots(n);
  std::lock_guard<std::mutex> lock(mu_);
  // Resolve every key first, so a bad key changes nothing.
  for (std::size_t i = 0; i < n; ++i) slots[i] = storage_.slot_of(keys[i]);
  std::size_t applied = 0;
  double batch_max = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    if (slots[i] < 0) continue;  // evicted since it was sampled
    slots[applied] = slots[i];
    scaled[applied] = scaled[i];
    batch_max = std::max(batch_max, priorities[i]);
    ++applied;
  }
  tree_.set(slots.data(), scaled.data(), applied);
  max_priority_ = std::max(max_priority_, batch_max);
  return applied;
}

PrioritizedReplayState PrioritizedReplay::export_state() const {
  std::lock_guard<std::mutex> lock(mu_);
  PrioritizedReplayState state;
  state.capacity = capacity();
  state.alpha = alpha_;
  state.max_priority = max_priority_;
  state.storage = storage_.export_state();
  state.scaled_priorities.assign(tree_.leaves(), tree_.leaves() + storage_.size());
  state.rng_state = rng_.state();
  return state;
}

void PrioritizedReplay::import_state(const PrioritizedReplayStateView& state) {
  if (state.capacity != capacity())
    throw std::invalid_argument("state: capacity " + std::to_string(state.capacity) +
                                " does not match this buffer's " + std::to_string(capacity()));
  if (state.alpha != alpha_)
    throw std::invalid_argument("state: alpha " + std::to_string(state.alpha) +
                                " does not match this buffer's " + std::to_string(alpha_));
  if (!(state.max_priority > 0.0) || !std::isfinite(state.max_priority))
    throw std::invalid_argument("state: max_priority must be finite and > 0");
  check_rng_state(state.rng_state);
  storage_.validate(state.storage);  // (first: the loop below reads `size` priorities)
  const std::size_t size = state.storage.size;
  if (size && state.scaled_priorities == nullptr)
    throw std::invalid_argument("state: scaled_priorities missing");
  for (std::size_t i = 0; i < size; ++i)
    if (!(state.scaled_priorities[i] >= kMinScaled && state.scaled_priorities[i] <= kMaxScaled))
      throw std::invalid_argument("state: scaled_priorities must be finite and > 0 (index " +
                                  std::to_string(i) + ")");
  std::lock_guard<std::mutex> lock(mu_);
  storage_.import_state(state.storage);
  tree_.clear();
  tree_.set_range(0, state.scaled_priorities, size);
  max_priority_ = state.max_priority;
  rng_.set_state(state.rng_state);
}

double PrioritizedReplay::tree_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tree_.total();
}

float PrioritizedReplay::tree_min() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tree_.min();
}

std::vector<float> PrioritizedReplay::scaled_priorities() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::vector<float>(tree_.leaves(), tree_.leaves() + storage_.size());
}

bool PrioritizedReplay::check_invariants(std::string* error) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!tree_.check_invariants(error)) return false;
  // Stored slots have mass, the others none.
  for (std::size_t s = 0; s < capacity(); ++s) {
    const bool stored = s < storage_.size();
    if (stored != (tree_.leaf(s) > 0.0f)) {
      if (error)
        *error = "slot " + std::to_string(s) +
                 (stored ? " is stored but has no priority" : " is empty but has a priority");
      return false;
    }
  }
  return true;
}

// ---------------------------------------------------------------------------
// UniformReplay

UniformReplay::UniformReplay(std::size_t capacity, std::vector<FieldSpec> fields, uint64_t seed)
    : storage_(capacity, std::move(fields)), rng_(seed) {}

std::size_t UniformReplay::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return storage_.size();
}

void UniformReplay::add(const void* const* columns, std::size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (std::size_t row = 0; row < n;) {
    const std::size_t run = std::min(n - row, capacity() - storage_.cursor());
    storage_.write(columns, row, run);
    row += run;
  }
}

void UniformReplay::sample(std::size_t n, void* const* out) {
  if (n == 0) throw std::invalid_argument("batch_size: must be positive");
  std::vector<int64_t> slots(n);
  std::lock_guard<std::mutex> lock(mu_);
  if (storage_.size() == 0)
    throw std::invalid_argument("batch_size: cannot sample from an empty buffer");
  for (std::size_t i = 0; i < n; ++i) slots[i] = static_cast<int64_t>(rng_.below(storage_.size()));
  storage_.gather(slots.data(), n, out);
}

UniformReplayState UniformReplay::export_state() const {
  std::lock_guard<std::mutex> lock(mu_);
  UniformReplayState state;
  state.capacity = capacity();
  state.storage = storage_.export_state();
  state.rng_state = rng_.state();
  return state;
}

void UniformReplay::import_state(const UniformReplayStateView& state) {
  if (state.capacity != capacity())
    throw std::invalid_argument("state: capacity " + std::to_string(state.capacity) +
                                " does not match this buffer's " + std::to_string(capacity()));
  check_rng_state(state.rng_state);
  std::lock_guard<std::mutex> lock(mu_);
  storage_.import_state(state.storage);
  rng_.set_state(state.rng_state);
}

}  // namespace zrl
