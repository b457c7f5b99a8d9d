// What the client bench drivers (client_bench.cc, client_load.cc) share: the
// size of the ACT frame they time, number parsing, and percentiles.
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

namespace zrl::bench {

// Bytes of the ACT frame a zrl::Client sends for a float32 [d] observation
// (docs/PROTOCOL.md, "Layout"): header, three descriptors, then obs, reward
// and flags, each at the next multiple of 64: the size of the raw reference.
inline uint64_t act_frame_bytes(int64_t d) {
  auto align = [](uint64_t n) { return (n + 63) & ~uint64_t{63}; };
  const uint64_t obs_at = align(48 + 3 * 80);
  const uint64_t reward_at = align(obs_at + 4 * static_cast<uint64_t>(d));
  const uint64_t flags_at = align(reward_at + 4);
  return flags_at + 1;
}

// The value of option `flag`: all of v as an int64_t or a double; anything else (or out of
// range) goes to the program's usage(message, status 1), which exits.
template <typename T, typename Usage>
T number_arg(const std::string& flag, const char* v, Usage usage) {
  static_assert(std::is_same_v<T, int64_t> || std::is_same_v<T, double>);
  char* end = nullptr;
  errno = 0;
  T x;
  if constexpr (std::is_same_v<T, int64_t>) {
    x = std::strtoll(v, &end, 10);
  } else {
    x = std::strtod(v, &end);
  }
  if (end == v || *end != '\0' || errno != 0) usage("bad value for " + flag + ": " + v, 1);
  return x;
}

template <typename Duration>
double micros(Duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

// Linear interpolation between closest ranks of sorted values (numpy's default); 0 if none.
inline double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0.0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}

}  // namespace zrl::bench
