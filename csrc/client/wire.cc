// The zrl wire format: encoder and validating decoder (see wire.h).
#include "wire.h"

#include <cstring>
#include <string>

namespace zrl::wire {
namespace {

constexpr uint64_t align_up(uint64_t n) { return (n + kAlign - 1) & ~uint64_t{kAlign - 1}; }

[[noreturn]] void reject(const char* reason, const std::string& detail) {
  throw ProtocolError(reason, std::string(reason) + ": " + detail);
}

// Python's repr of a bytes value is what wire.py prints for a bad magic;
// a hex dump says the same without pretending to be Python.
std::string hex(const uint8_t* p, std::size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

void check_name(std::string_view name) {
  if (name.empty() || name.size() >= kNameBytes || name.find('\0') != std::string_view::npos ||
      !is_valid_utf8(name)) {
    throw UsageError("array name '" + std::string(name) + "' must be 1.." + std::to_string(kNameBytes - 1) +
                     " UTF-8 bytes without NUL");
  }
}

}  // namespace

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kHello: return "HELLO";
    case Kind::kHelloReply: return "HELLO_REPLY";
    case Kind::kTrajectory: return "TRAJECTORY";
    case Kind::kWeights: return "WEIGHTS";
    case Kind::kStats: return "STATS";
    case Kind::kError: return "ERROR";
    case Kind::kShutdown: return "SHUTDOWN";
    case Kind::kGradient: return "GRADIENT";
    case Kind::kAct: return "ACT";
    case Kind::kAction: return "ACTION";
    case Kind::kBye: return "BYE";
  }
  return "UNKNOWN";
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBool: return "bool";
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat16: return "float16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kUInt16: return "uint16";
    case DType::kUInt32: return "uint32";
  }
  return "unknown";
}

Shape Shape::of(const std::vector<int64_t>& dims) {
  if (dims.size() > kMaxDims) {
    throw UsageError("at most " + std::to_string(kMaxDims) + " dims, got " + std::to_string(dims.size()));
  }
  Shape s;
  s.ndim = static_cast<uint8_t>(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0 || dims[i] > int64_t{0xFFFFFFFF}) {
      throw UsageError("dim " + std::to_string(dims[i]) + " does not fit the wire's uint32");
    }
    s.dims[i] = static_cast<uint32_t>(dims[i]);
  }
  return s;
}

uint64_t Shape::num_elements() const {
  uint64_t n = 1;
  for (uint8_t i = 0; i < ndim; ++i) n *= dims[i];
  return n;
}

bool Shape::operator==(const Shape& other) const {
  if (ndim != other.ndim) return false;
  for (uint8_t i = 0; i < ndim; ++i) {
    if (dims[i] != other.dims[i]) return false;
  }
  return true;
}

std::string Shape::str() const {
  std::string s = "(";
  for (uint8_t i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  if (ndim == 1) s += ",";
  return s + ")";
}

bool is_valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (std::size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Encoding

void encode(const Header& header, const ArrayRef* arrays, std::size_t n_arrays, std::string_view meta,
            std::vector<uint8_t>* out) {
  if (n_arrays > kMaxArrays) {
    throw UsageError("at most " + std::to_string(kMaxArrays) + " arrays per message, got " +
                     std::to_string(n_arrays));
  }
  if (meta.size() > 0xFFFFFFFFu) throw UsageError("meta longer than 4 GiB");
  for (std::size_t i = 0; i < n_arrays; ++i) {
    check_name(arrays[i].name);
    for (std::size_t j = 0; j < i; ++j) {
      if (arrays[j].name == arrays[i].name) {
        throw UsageError("duplicate array name '" + std::string(arrays[i].name) + "'");
      }
    }
  }

  // Layout first, as wire.Layout: each array at the next multiple of 64.
  const uint64_t meta_offset = kHeaderSize + kDescriptorSize * n_arrays;
  uint64_t total = meta_offset + meta.size();
  uint64_t next = align_up(total);
  std::array<uint64_t, kMaxArrays> offsets{};
  for (std::size_t i = 0; i < n_arrays; ++i) {
    offsets[i] = next;
    const uint64_t nbytes = itemsize(arrays[i].dtype) * arrays[i].shape.num_elements();
    total = next + nbytes;
    next = align_up(total);
  }

  // assign() zeroes the whole frame, padding included, in one pass.
  out->assign(total, 0);
  uint8_t* buf = out->data();

  std::memcpy(buf + kMagicOffset, kMagic, sizeof kMagic);
  store_le<uint16_t>(buf + kVersionOffset, kProtocolVersion);
  store_le<uint16_t>(buf + kKindOffset, static_cast<uint16_t>(header.kind));
  store_le<uint32_t>(buf + kSenderIdOffset, header.sender_id);
  store_le<uint32_t>(buf + kArrayCountOffset, static_cast<uint32_t>(n_arrays));
  store_le<uint64_t>(buf + kSeqOffset, header.seq);
  store_le<uint64_t>(buf + kPolicyVersionOffset, header.policy_version);
  store_le<uint32_t>(buf + kMetaLenOffset, static_cast<uint32_t>(meta.size()));
  store_le<uint32_t>(buf + kFlagsOffset, 0);  // reserved
  store_le<uint64_t>(buf + kTotalOffset, total);

  for (std::size_t i = 0; i < n_arrays; ++i) {
    const ArrayRef& a = arrays[i];
    uint8_t* d = buf + kHeaderSize + i * kDescriptorSize;
    std::memcpy(d + kDescNameOffset, a.name.data(), a.name.size());  // the rest of the 32 bytes stays NUL
    d[kDescDtypeOffset] = static_cast<uint8_t>(a.dtype);
    d[kDescNdimOffset] = a.shape.ndim;
    // the reserved bytes stay 0
    for (std::size_t k = 0; k < kMaxDims; ++k) store_le<uint32_t>(d + kDescDimsOffset + 4 * k, k < a.shape.ndim ? a.shape.dims[k] : 0);
    const uint64_t nbytes = itemsize(a.dtype) * a.shape.num_elements();
    store_le<uint64_t>(d + kDescDataOffset, offsets[i]);
    store_le<uint64_t>(d + kDescNbytesOffset, nbytes);
    if (nbytes) std::memcpy(buf + offsets[i], a.data, nbytes);
  }
  if (!meta.empty()) std::memcpy(buf + meta_offset, meta.data(), meta.size());
}

// ---------------------------------------------------------------------------
// Decoding

const ArrayView* Message::find(std::string_view name) const {
  for (const ArrayView& a : arrays) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

void decode(const void* data, std::size_t size, Message* out, std::size_t max_bytes) {
  const auto* buf = static_cast<const uint8_t*>(data);
  const uint64_t n = size;
  if (n > max_bytes) reject("too_large", std::to_string(n) + " bytes > cap " + std::to_string(max_bytes));
  if (n < kHeaderSize) reject("too_short", std::to_string(n) + " bytes < header " + std::to_string(kHeaderSize));
  if (std::memcmp(buf + kMagicOffset, kMagic, sizeof kMagic) != 0) reject("bad_magic", "magic 0x" + hex(buf, 4));
  const auto version = load_le<uint16_t>(buf + kVersionOffset);
  if (version != kProtocolVersion) {
    reject("bad_version", "protocol version " + std::to_string(version) + ", this side speaks " +
                              std::to_string(kProtocolVersion));
  }
  const auto kind = load_le<uint16_t>(buf + kKindOffset);
  if (!is_known_kind(kind)) reject("bad_kind", "unknown kind " + std::to_string(kind));
  const auto sender_id = load_le<uint32_t>(buf + kSenderIdOffset);
  const auto n_arrays = load_le<uint32_t>(buf + kArrayCountOffset);
  const auto seq = load_le<uint64_t>(buf + kSeqOffset);
  const auto policy_version = load_le<uint64_t>(buf + kPolicyVersionOffset);
  const auto meta_len = load_le<uint32_t>(buf + kMetaLenOffset);
  const auto flags = load_le<uint32_t>(buf + kFlagsOffset);
  const auto total = load_le<uint64_t>(buf + kTotalOffset);
  if (total != n) {
    reject("bad_length", "header says " + std::to_string(total) + " bytes, frame has " + std::to_string(n));
  }
  if (flags != 0 || n_arrays > kMaxArrays) {
    reject("bad_header", "flags " + std::to_string(flags) + ", " + std::to_string(n_arrays) + " arrays (max " +
                             std::to_string(kMaxArrays) + ")");
  }
  const uint64_t meta_off = kHeaderSize + kDescriptorSize * uint64_t{n_arrays};
  const uint64_t data_start = meta_off + meta_len;
  if (data_start > n) {
    reject("bad_length", "descriptors and meta end at " + std::to_string(data_start) + ", frame has " +
                             std::to_string(n) + " bytes");
  }

  out->arrays.clear();
  for (uint32_t i = 0; i < n_arrays; ++i) {
    const uint8_t* d = buf + kHeaderSize + std::size_t{i} * kDescriptorSize;
    // The name is its bytes up to the trailing NULs; a NUL inside is an error.
    std::size_t len = kNameBytes;
    while (len > 0 && d[kDescNameOffset + len - 1] == 0) --len;
    const std::string_view name(reinterpret_cast<const char*>(d + kDescNameOffset), len);
    const std::string label = "array " + std::to_string(i);
    if (!is_valid_utf8(name)) reject("bad_descriptor", label + ": name is not UTF-8");
    if (name.empty() || name.find('\0') != std::string_view::npos || out->find(name) != nullptr) {
      reject("bad_descriptor", label + ": empty, NUL-containing or duplicate name '" + std::string(name) + "'");
    }
    const std::string quoted = "array '" + std::string(name) + "'";
    const uint8_t code = d[kDescDtypeOffset];
    const uint8_t ndim = d[kDescNdimOffset];
    if (load_le<uint16_t>(d + kDescReservedOffset) != 0 || load_le<uint32_t>(d + kDescReservedOffset + 2) != 0) {
      reject("bad_descriptor", quoted + ": reserved bytes are not zero");
    }
    if (!is_known_dtype(code)) reject("bad_dtype", quoted + ": unknown dtype code " + std::to_string(code));
    const auto dtype = static_cast<DType>(code);
    if (ndim > kMaxDims) {
      reject("bad_descriptor", quoted + ": " + std::to_string(ndim) + " dims > " + std::to_string(kMaxDims));
    }
    Shape shape;
    shape.ndim = ndim;
    for (std::size_t k = 0; k < kMaxDims; ++k) {
      const auto dim = load_le<uint32_t>(d + kDescDimsOffset + 4 * k);
      if (k < ndim) {
        shape.dims[k] = dim;
      } else if (dim != 0) {
        reject("bad_descriptor", quoted + ": unused dims are not zero");
      }
    }
    const auto offset = load_le<uint64_t>(d + kDescDataOffset);
    const auto nbytes = load_le<uint64_t>(d + kDescNbytesOffset);
    // itemsize x product(shape), where an overflow of 64 bits can only mismatch.
    uint64_t expected = itemsize(dtype);
    bool overflow = false;
    for (uint8_t k = 0; k < ndim; ++k) overflow |= __builtin_mul_overflow(expected, uint64_t{shape.dims[k]}, &expected);
    if (overflow || nbytes != expected) {
      reject("bad_length", quoted + ": " + std::to_string(nbytes) + " bytes for shape " + shape.str() + " of " +
                               dtype_name(dtype));
    }
    if (offset % itemsize(dtype) != 0) {
      reject("bad_descriptor", quoted + ": offset " + std::to_string(offset) + " not aligned to " +
                                   std::to_string(itemsize(dtype)));
    }
    out->arrays.push_back(ArrayView{name, dtype, shape, offset, nbytes, nullptr});
  }
  // Bounds last, as wire.py (whose descriptor checks are cached per layout).
  for (ArrayView& a : out->arrays) {
    if (a.offset < data_start || a.nbytes > n || a.offset > n - a.nbytes) {
      reject("bad_length", "array '" + std::string(a.name) + "' bytes [" + std::to_string(a.offset) + ", " +
                               std::to_string(a.offset + a.nbytes) + ") outside data [" +
                               std::to_string(data_start) + ", " + std::to_string(n) + ")");
    }
    a.data = buf + a.offset;
  }
  out->header = Header{static_cast<Kind>(kind), sender_id, seq, policy_version};
  out->meta = std::string_view(reinterpret_cast<const char*>(buf + meta_off), meta_len);
}

// ---------------------------------------------------------------------------
// The client's messages

void encode_hello(uint64_t seq, std::string_view meta_json, std::vector<uint8_t>* out) {
  encode(Header{Kind::kHello, 0, seq, 0}, nullptr, 0, meta_json, out);
}

void encode_act(uint64_t seq, uint8_t flags, float reward, const ArrayRef* obs, std::vector<uint8_t>* out) {
  // docs/PROTOCOL.md fixes the order: obs, reward, flags.
  std::array<ArrayRef, 3> arrays;
  std::size_t n = 0;
  if (obs != nullptr) {
    arrays[n] = *obs;
    arrays[n].name = "obs";
    ++n;
  }
  arrays[n++] = ArrayRef{"reward", DType::kFloat32, Shape{}, &reward};
  arrays[n++] = ArrayRef{"flags", DType::kUInt8, Shape{}, &flags};
  encode(Header{Kind::kAct, 0, seq, 0}, arrays.data(), n, {}, out);
}

void encode_stats(uint64_t seq, std::string_view name, double value, std::vector<uint8_t>* out) {
  Shape one;
  one.ndim = 1;
  one.dims[0] = 1;
  const ArrayRef array{name, DType::kFloat64, one, &value};
  encode(Header{Kind::kStats, 0, seq, 0}, &array, 1, {}, out);
}

void encode_bye(uint64_t seq, std::vector<uint8_t>* out) {
  encode(Header{Kind::kBye, 0, seq, 0}, nullptr, 0, {}, out);
}

}  // namespace zrl::wire
