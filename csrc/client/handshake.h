// The client's HELLO meta (internal to libzrl_client): a JSON object whose
// bytes must equal what Python's json.dumps(d, separators=(",", ":")) gives
// for the same dict (docs/PROTOCOL.md, "Agent server", and the golden frame
// client_hello.bin), keys in the documented order:
//
//   {"role":"client","protocol":1,"name":...,"obs_space":{...},"action_space":{...}}
//
// No JSON library: the few strings are written by hand, matching json.dumps's
// defaults (ensure_ascii: non-ASCII as \uXXXX escapes, lowercase hex,
// surrogate pairs above U+FFFF) and repr() for floats (shortest round-trip
// digits, fixed notation for exponents -4..15, "1e-05" / "1e+16" otherwise,
// ".0" on integral values), so even bounds like 0.1 come out as Python
// writes them. Non-finite bounds are refused (json.dumps(allow_nan=False)).
#pragma once

#include <string>
#include <string_view>

#include "zrl/client.h"

namespace zrl::detail {

// repr(float(value)) as Python prints it; value must be finite.
std::string python_float_repr(double value);

// A JSON string literal as json.dumps writes it; UsageError if s is not UTF-8.
std::string json_string(std::string_view s);

std::string space_json(const ObsSpec& spec);
std::string space_json(const ActionSpec& spec);
std::string hello_meta(std::string_view name, const ObsSpec& obs, const ActionSpec& action);

}  // namespace zrl::detail
