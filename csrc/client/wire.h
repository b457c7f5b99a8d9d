// The zrl wire format in C++ (internal to libzrl_client): one ZeroMQ frame
// per message, [header 48 B][descriptors 80 B x n][meta][pad][array 0][pad]...
// docs/PROTOCOL.md gives the bytes; zrl/wire.py is the Python twin. Both are
// checked against the golden frames in tests/data/golden/, so this module is
// kept free of sockets and of the Client's state: tests call it directly.
//
// encode writes a frame as wire.py's encode does (arrays at the next multiple
// of 64, zero padding, the frame ending at the last array). decode checks a
// frame as wire.py's decode does, in the same order and with the same reason
// codes, and throws zrl::ProtocolError(reason, detail) on the first problem.
//
// Pure functions, no shared state: safe from any number of threads.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zrl/client.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
// Headers are written byte by byte, but array payloads are copied as they lie
// in memory, and the wire is little-endian.
#error "libzrl_client supports little-endian hosts only"
#endif

namespace zrl::wire {

inline constexpr char kMagic[4] = {'Z', 'R', 'L', 'W'};
inline constexpr uint16_t kProtocolVersion = ZRL_CLIENT_PROTOCOL_VERSION;
inline constexpr std::size_t kHeaderSize = 48;
// Header fields a sender rewrites per message (and receivers read), as byte offsets.
inline constexpr std::size_t kSeqOffset = 16;
inline constexpr std::size_t kPolicyVersionOffset = 24;
inline constexpr std::size_t kTotalOffset = 40;
inline constexpr std::size_t kDescriptorSize = 80;
inline constexpr std::size_t kAlign = 64;
inline constexpr std::size_t kMaxDims = 6;

inline constexpr std::size_t kMaxArrays = 64;
inline constexpr std::size_t kNameBytes = 32;  // names are 1..31 bytes, NUL-padded
// Replies to a client are small (an action); anything larger is hostile.
inline constexpr std::size_t kDefaultMaxBytes = std::size_t{64} << 20;

// Little-endian stores and loads, byte by byte: the frame's fields are not
// aligned for their types, and this states the byte order explicitly.
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

enum class Kind : uint16_t {
  kHello = 1,
  kHelloReply = 2,
  kTrajectory = 3,
  kWeights = 4,
  kStats = 5,
  kError = 6,
  kShutdown = 7,
  kAct = 16,
  kAction = 17,
  kBye = 18,
};
bool is_known_kind(uint16_t kind);
const char* kind_name(Kind kind);  // "HELLO", "ACT", ...

// ACT flags (the `flags` array, uint8).
inline constexpr uint8_t kFlagFirst = 1;
inline constexpr uint8_t kFlagLast = 2;
inline constexpr uint8_t kFlagTruncated = 4;

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
bool is_known_dtype(uint8_t code);
std::size_t itemsize(DType dtype);
const char* dtype_name(DType dtype);  // numpy's names: "float32", "bool", ...

struct Shape {
  uint8_t ndim = 0;
  std::array<uint32_t, kMaxDims> dims{};

  // Throws UsageError for more than 6 dims or a dim outside [0, 2^32).
  static Shape of(const std::vector<int64_t>& dims);
  uint64_t num_elements() const;
  bool operator==(const Shape& other) const;
  std::string str() const;  // "(3, 4)", "()" as numpy prints shapes
};

// An array to encode: a view of caller memory holding num_elements() values.
struct ArrayRef {
  std::string_view name;
  DType dtype = DType::kUInt8;
  Shape shape;
  const void* data = nullptr;
};

struct Header {
  Kind kind = Kind::kHello;
  uint32_t sender_id = 0;
  uint64_t seq = 0;
  uint64_t policy_version = 0;
};

// Writes one frame into *out (resized to the frame's length; padding zeroed;
// capacity reused, so a sender that keeps its buffer allocates once). Throws
// UsageError for a name that is empty, 32+ bytes or holds NUL, a duplicate
// name, or more than 64 arrays.
void encode(const Header& header, const ArrayRef* arrays, std::size_t n_arrays,
            std::string_view meta, std::vector<uint8_t>* out);

// An array inside a decoded frame; name and data point into the frame.
struct ArrayView {
  std::string_view name;
  DType dtype = DType::kUInt8;
  Shape shape;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;
};

struct Message {
  Header header;
  std::string_view meta;  // into the frame
  std::vector<ArrayView> arrays;

  const ArrayView* find(std::string_view name) const;  // nullptr if absent
};

// Parses and checks one frame; *out's views point into `data`, which must
// outlive them. Throws ProtocolError with the reasons of docs/PROTOCOL.md:
// too_large, too_short, bad_magic, bad_version, bad_kind, bad_length,
// bad_header, bad_descriptor, bad_dtype. Reuses out->arrays' capacity.
void decode(const void* data, std::size_t size, Message* out,
            std::size_t max_bytes = kDefaultMaxBytes);

// ---------------------------------------------------------------------------
// The client's messages (docs/PROTOCOL.md, "Agent server"). Client builds
// every frame it sends with these, so the golden tests cover its exact bytes.
// Clients send sender_id 0 and policy_version 0.

void encode_hello(uint64_t seq, std::string_view meta_json, std::vector<uint8_t>* out);
// obs may be nullptr: a LAST request without TRUNCATED carries no obs.
void encode_act(uint64_t seq, uint8_t flags, float reward, const ArrayRef* obs,
                std::vector<uint8_t>* out);
void encode_stats(uint64_t seq, std::string_view name, double value, std::vector<uint8_t>* out);
void encode_bye(uint64_t seq, std::vector<uint8_t>* out);

// True if s is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool is_valid_utf8(std::string_view s);

}  // namespace zrl::wire
