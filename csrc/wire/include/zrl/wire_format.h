// The zrl wire format: one ZeroMQ frame per message,
//
//   [header 48 B][descriptors 80 B x n][meta][pad][array 0][pad][array 1]...
//
// every integer little-endian. docs/PROTOCOL.md gives the bytes; zrl/protocol/ is
// the Python twin. This header is the one C++ statement of the format's
// constants, shared by libzrl_client (it is installed next to <zrl/client.h>)
// and by zrl's core (the learner's FrameGate, the actors' native send path).
// Constants and byte-order helpers only: no code to link, standard headers only.
#pragma once

#include <cstddef>
#include <cstdint>

// The protocol version, for the preprocessor too (<zrl/client.h> reports it).
#define ZRL_WIRE_PROTOCOL_VERSION 1

namespace zrl::wire {

inline constexpr char kMagic[4] = {'Z', 'R', 'L', 'W'};
inline constexpr uint16_t kProtocolVersion = ZRL_WIRE_PROTOCOL_VERSION;

// The header: 48 bytes at the frame's start, its fields at these byte offsets.
inline constexpr std::size_t kHeaderSize = 48;
inline constexpr std::size_t kMagicOffset = 0;           // 4 bytes: kMagic
inline constexpr std::size_t kVersionOffset = 4;         // u16: kProtocolVersion
inline constexpr std::size_t kKindOffset = 6;            // u16: Kind
inline constexpr std::size_t kSenderIdOffset = 8;        // u32
inline constexpr std::size_t kArrayCountOffset = 12;     // u32: descriptors, <= kMaxArrays
inline constexpr std::size_t kSeqOffset = 16;            // u64, below 2^63
inline constexpr std::size_t kPolicyVersionOffset = 24;  // u64, below 2^63
inline constexpr std::size_t kMetaLenOffset = 32;        // u32
inline constexpr std::size_t kFlagsOffset = 36;          // u32, reserved: 0
inline constexpr std::size_t kTotalOffset = 40;          // u64: the frame's length

// A descriptor: 80 bytes per array, right after the header, its fields at these
// byte offsets from the descriptor's start.
inline constexpr std::size_t kDescriptorSize = 80;
inline constexpr std::size_t kDescNameOffset = 0;       // kNameBytes: UTF-8, NUL-padded
inline constexpr std::size_t kDescDtypeOffset = 32;     // u8: DType
inline constexpr std::size_t kDescNdimOffset = 33;      // u8, <= kMaxDims
inline constexpr std::size_t kDescReservedOffset = 34;  // u16 then u32, both 0
inline constexpr std::size_t kDescDimsOffset = 40;      // u32 x kMaxDims; unused dims 0
inline constexpr std::size_t kDescDataOffset = 64;      // u64: the array's offset in the frame
inline constexpr std::size_t kDescNbytesOffset = 72;    // u64: itemsize x product(dims)

inline constexpr std::size_t kNameBytes = 32;  // names are 1..31 bytes, NUL-padded
inline constexpr std::size_t kMaxDims = 6;
inline constexpr std::size_t kMaxArrays = 64;
// Writers put each array at the next multiple of kAlign; readers only require a
// multiple of its item size.
inline constexpr std::size_t kAlign = 64;

static_assert(kTotalOffset + 8 == kHeaderSize, "the header ends with total_len");
static_assert(kDescDimsOffset + 4 * kMaxDims == kDescDataOffset, "the dims end where the offset starts");
static_assert(kDescNbytesOffset + 8 == kDescriptorSize, "a descriptor ends with nbytes");

enum class Kind : uint16_t {
  kHello = 1,
  kHelloReply = 2,
  kTrajectory = 3,
  kWeights = 4,
  kStats = 5,
  kError = 6,
  kShutdown = 7,
  kGradient = 8,  // actor -> learner: a gradient computed on the actor's rollout (A3C)
  kAct = 16,
  kAction = 17,
  kBye = 18,
};

constexpr bool is_known_kind(uint16_t kind) {
  return (kind >= static_cast<uint16_t>(Kind::kHello) && kind <= static_cast<uint16_t>(Kind::kGradient)) ||
         (kind >= static_cast<uint16_t>(Kind::kAct) && kind <= static_cast<uint16_t>(Kind::kBye));
}

// ACT flags (the `flags` array, uint8).
inline constexpr uint8_t kFlagFirst = 1;
inline constexpr uint8_t kFlagLast = 2;
inline constexpr uint8_t kFlagTruncated = 4;

// Array dtype codes; any other code is rejected (bad_dtype).
enum class DType : uint8_t {
  kBool = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kInt16 = 4,
  kInt32 = 5,
  kInt64 = 6,
  kFloat16 = 7,
  kFloat32 = 8,
  kFloat64 = 9,
  kUInt16 = 10,
  kUInt32 = 11,
};

constexpr bool is_known_dtype(uint8_t code) { return code >= 1 && code <= 11; }

// Bytes per element; 0 for a code outside the table.
constexpr std::size_t itemsize(DType dtype) {
  switch (dtype) {
    case DType::kBool:
    case DType::kUInt8:
    case DType::kInt8:
      return 1;
    case DType::kInt16:
    case DType::kFloat16:
    case DType::kUInt16:
      return 2;
    case DType::kInt32:
    case DType::kFloat32:
    case DType::kUInt32:
      return 4;
    case DType::kInt64:
    case DType::kFloat64:
      return 8;
  }
  return 0;
}

// Little-endian stores and loads, byte by byte: the frame's fields are not
// aligned for their types, and this states the byte order on any host.
template <typename T>
inline void store_le(uint8_t* p, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
}

template <typename T>
inline T load_le(const uint8_t* p) {
  uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<T>(v);
}

}  // namespace zrl::wire
