// A trajectory frame laid out as zrl/wire.py lays it out, for the C++ tests of
// the receiver's paths (wire_gate_test.cc, zmq_native_test.cc).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "wire/wire_gate.h"

namespace zrl::testing {

inline constexpr uint16_t kTrajectory = 3;

template <typename T>
inline void put(std::vector<uint8_t>& f, std::size_t at, T v) {
  std::memcpy(f.data() + at, &v, sizeof(T));
}

// A frame as zrl/wire.py lays it out: header, two descriptors (action int64 [4] at
// 256, final_index int32 [2] at 320), meta up to 48 bytes, arrays at multiples of 64.
struct Frame {
  std::vector<uint8_t> bytes;
  static constexpr std::size_t kAction = 256, kIndex = 320, kEnd = 328;

  explicit Frame(uint32_t meta_len = 0) : bytes(kEnd, 0) {
    std::memcpy(bytes.data(), "ZRLW", 4);
    put<uint16_t>(bytes, 4, 1);            // protocol version
    put<uint16_t>(bytes, 6, kTrajectory);  // kind
    put<uint32_t>(bytes, 8, 7);            // sender id
    put<uint32_t>(bytes, 12, 2);           // arrays
    put<uint64_t>(bytes, 16, 42);          // seq
    put<uint64_t>(bytes, 24, 5);           // policy version
    put<uint32_t>(bytes, 32, meta_len);
    put<uint32_t>(bytes, 36, 0);           // flags
    put<uint64_t>(bytes, 40, kEnd);        // total
    descriptor(0, "action", 6, 4, kAction, 32);
    descriptor(1, "final_index", 5, 2, kIndex, 8);
    for (int i = 0; i < 4; ++i) put<int64_t>(bytes, kAction + 8 * i, i);
    put<int32_t>(bytes, kIndex, 3);
    put<int32_t>(bytes, kIndex + 4, 9);
  }
  void descriptor(int i, const char* name, uint8_t dtype, uint32_t dim0, uint64_t offset,
                  uint64_t nbytes) {
    const std::size_t at = 48 + 80 * i;
    std::memcpy(bytes.data() + at, name, std::strlen(name));
    bytes[at + 32] = dtype;
    bytes[at + 33] = 1;  // ndim
    put<uint32_t>(bytes, at + 40, dim0);
    put<uint64_t>(bytes, at + 64, offset);
    put<uint64_t>(bytes, at + 72, nbytes);
  }
  std::string block() const { return std::string(bytes.begin() + 48, bytes.begin() + 208); }
  zrl::GateResult check(const FrameGate& g) const { return g.check(bytes.data(), bytes.size()); }
};

}  // namespace zrl::testing
