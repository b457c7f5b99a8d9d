// Drawing actions from categorical policies, for the actors' batched act().
//
// PyTorch's multinomial on softmax probabilities, then log_softmax and gather for
// the recorded log mu(a|x), cost an actor ~25 us per call of a few rows (checks,
// allocations, five ops); the policy's whole act() on 8 Atari frames is ~330 us.
// This is the same draw by inverse CDF in one pass per row.
// A pure function: no allocation, safe from any number of threads.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zrl {

// logits: b rows of n float32 (log-probabilities up to a constant per row; -inf marks an
// impossible action); u: b uniform draws in [0, 1). For each row, with p = softmax(logits):
//   actions[i] = the first k with p[0] + ... + p[k] > u[i] (the last possible action if
//                rounding leaves the sum short of u[i]),
//   logp[i]    = log p[actions[i]] = (l_k - max l) - log(sum_j exp(l_j - max l)).
// Sums in double. Returns the index of the first row with a NaN or +inf logit, or with
// every logit -inf (nothing can be drawn), or b when every row is fine; rows from the
// bad one on are not written.
std::size_t sample_categorical(const float* logits, std::size_t b, std::size_t n,
                               const double* u, std::int64_t* actions, float* logp);

// The index of the first draw outside [0, 1) (NaN included), or n when all are inside:
// sample_categorical's precondition on u.
std::size_t first_draw_outside_unit(const double* u, std::size_t n);

}  // namespace zrl
