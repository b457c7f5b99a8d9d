// The client's HELLO meta, byte for byte as Python's json.dumps (handshake.h).
#include "handshake.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <system_error>
#include <vector>

#include "wire.h"

namespace zrl::detail {
namespace {

void append_hex4(std::string* out, uint32_t v) {
  static const char* digits = "0123456789abcdef";  // json.dumps writes lowercase
  *out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) *out += digits[(v >> shift) & 15];
}

std::string shape_json(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string bound_json(const std::optional<double>& bound) {
  return bound ? python_float_repr(*bound) : "null";
}

std::string box_json(const std::vector<int64_t>& shape, const char* dtype, const std::optional<double>& low,
                     const std::optional<double>& high) {
  return std::string("{\"type\":\"box\",\"shape\":") + shape_json(shape) + ",\"dtype\":\"" + dtype +
         "\",\"low\":" + bound_json(low) + ",\"high\":" + bound_json(high) + "}";
}

}  // namespace

std::string python_float_repr(double value) {
  if (!std::isfinite(value)) throw UsageError("a bound must be finite (JSON has no NaN or infinity)");
  // The shortest digits that round-trip (what repr uses, David Gay's
  // algorithm; std::to_chars gives the same), in scientific form d.ddde±XX.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  if (res.ec != std::errc()) throw Error("cannot format a double");
  const std::string_view sci(buf, static_cast<std::size_t>(res.ptr - buf));
  const std::size_t e = sci.find('e');
  const bool negative = sci[0] == '-';
  std::string digits;
  for (std::size_t i = negative ? 1 : 0; i < e; ++i) {
    if (sci[i] != '.') digits += sci[i];
  }
  const int exponent = std::atoi(std::string(sci.substr(e + 1)).c_str());
  // Python's float_repr_style 'short' with repr's rule: decpt is where the
  // decimal point falls after the first `decpt` digits.
  const int decpt = exponent + 1;
  std::string out = negative ? "-" : "";
  const int ndigits = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (ndigits > 1) out += "." + digits.substr(1);
    const int x = decpt - 1;
    out += x < 0 ? "e-" : "e+";
    const std::string mag = std::to_string(std::abs(x));
    if (mag.size() < 2) out += "0";
    out += mag;
  } else if (decpt <= 0) {
    out += "0." + std::string(static_cast<std::size_t>(-decpt), '0') + digits;
  } else if (decpt >= ndigits) {
    out += digits + std::string(static_cast<std::size_t>(decpt - ndigits), '0') + ".0";
  } else {
    out += digits.substr(0, static_cast<std::size_t>(decpt)) + "." + digits.substr(static_cast<std::size_t>(decpt));
  }
  return out;
}

std::string json_string(std::string_view s) {
  if (!wire::is_valid_utf8(s)) throw UsageError("the client name is not valid UTF-8");
  std::string out = "\"";
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          // json.dumps escapes everything outside ' '..'~', DEL included.
          if (c < 0x20 || c == 0x7f) {
            append_hex4(&out, c);
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // Decode one UTF-8 sequence (already validated) and escape it.
    const std::size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
    uint32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    for (std::size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    if (cp >= 0x10000) {
      cp -= 0x10000;
      append_hex4(&out, 0xD800 | (cp >> 10));
      append_hex4(&out, 0xDC00 | (cp & 0x3FF));
    } else {
      append_hex4(&out, cp);
    }
    i += len;
  }
  return out + "\"";
}

std::string space_json(const ObsSpec& spec) {
  return box_json(spec.shape, obs_dtype_name(spec.dtype), spec.low, spec.high);
}

std::string space_json(const ActionSpec& spec) {
  if (spec.is_discrete()) return "{\"type\":\"discrete\",\"n\":" + std::to_string(spec.n()) + "}";
  return box_json(spec.shape(), "float32", spec.low(), spec.high());
}

std::string hello_meta(std::string_view name, const ObsSpec& obs, const ActionSpec& action) {
  return "{\"role\":\"client\",\"protocol\":" + std::to_string(ZRL_CLIENT_PROTOCOL_VERSION) +
         ",\"name\":" + json_string(name) + ",\"obs_space\":" + space_json(obs) +
         ",\"action_space\":" + space_json(action) + "}";
}

}  // namespace zrl::detail
