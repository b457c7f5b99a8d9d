// The zrl wire format's encoder and decoder (internal to libzrl_client): one
// ZeroMQ frame per message, [header 48 B][descriptors 80 B x n][meta][pad][array 0]...
// The format's constants are public, in <zrl/wire_format.h> (shared with zrl's
// core); docs/PROTOCOL.md gives the bytes; zrl/wire.py is the Python twin. Both are
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
#include "zrl/wire_format.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
// Headers are written byte by byte, but array payloads are copied as they lie
// in memory, and the wire is little-endian.
#error "libzrl_client supports little-endian hosts only"
#endif

namespace zrl::wire {

// Replies to a client are small (an action); anything larger is hostile.
inline constexpr std::size_t kDefaultMaxBytes = std::size_t{64} << 20;

const char* kind_name(Kind kind);     // "HELLO", "ACT", ...
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
