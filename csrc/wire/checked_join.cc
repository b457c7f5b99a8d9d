#include "wire/checked_join.h"

namespace zrl {

std::vector<std::size_t> join_checked(uint8_t* dst, const std::vector<JoinPart>& parts, uint64_t outer,
                                      uint32_t itemsize, CopyRule rule, uint64_t bound) {
  uint64_t row = 0;  // bytes of dst per outer step
  for (const JoinPart& p : parts) row += p.count * itemsize;
  std::vector<std::size_t> broken;
  uint64_t col = 0;  // bytes of a row of dst before part i's
  for (std::size_t i = 0; i < parts.size(); ++i) {  // part by part: each is read front to back
    const uint64_t n = parts[i].count;
    bool holds = true;
    for (uint64_t o = 0; o < outer; ++o)
      if (!copy_checked(dst + o * row + col, parts[i].data + o * n * itemsize, n, itemsize, rule, bound)) holds = false;
    if (!holds) broken.push_back(i);
    col += n * itemsize;
  }
  return broken;
}

}  // namespace zrl
