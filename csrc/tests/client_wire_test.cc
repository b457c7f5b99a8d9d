// GoogleTest of libzrl_client's wire module and hello JSON against the golden
// frames that zrl/wire.py wrote (tests/data/golden/, described by
// manifest.json; regenerate with `python tests/data/make_golden.py`): the
// C++ encoder must produce exactly those bytes from the manifest's values,
// the decoder must read them back, and corrupted frames must be rejected
// with the reason codes of docs/PROTOCOL.md.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "client_test_json.h"
#include "handshake.h"
#include "wire.h"
#include "zrl/client.h"

namespace {

namespace wire = zrl::wire;
using zrl_test::Json;

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::vector<uint8_t> golden(const std::string& name) { return read_file(std::string(ZRL_GOLDEN_DIR) + "/" + name + ".bin"); }

const Json& manifest() {
  static const Json m = [] {
    const std::vector<uint8_t> bytes = read_file(std::string(ZRL_GOLDEN_DIR) + "/manifest.json");
    return Json::parse(std::string(bytes.begin(), bytes.end()));
  }();
  return m;
}

wire::DType dtype_from_name(const std::string& name) {
  for (uint8_t code = 1; code <= 11; ++code) {
    if (name == wire::dtype_name(static_cast<wire::DType>(code))) return static_cast<wire::DType>(code);
  }
  throw std::runtime_error("unknown dtype " + name);
}

// The manifest's values of one array as raw little-endian bytes of its dtype.
std::vector<uint8_t> array_bytes(wire::DType dtype, const Json& values) {
  std::vector<uint8_t> out;
  auto put = [&out](const auto& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(v));
  };
  for (const Json& v : values.array) {
    const double x = v.type == Json::Type::kBool ? (v.boolean ? 1.0 : 0.0) : v.number;
    switch (dtype) {
      case wire::DType::kBool:
      case wire::DType::kUInt8: put(static_cast<uint8_t>(x)); break;
      case wire::DType::kInt8: put(static_cast<int8_t>(x)); break;
      case wire::DType::kInt16: put(static_cast<int16_t>(x)); break;
      case wire::DType::kInt32: put(static_cast<int32_t>(x)); break;
      case wire::DType::kInt64: put(static_cast<int64_t>(x)); break;
      case wire::DType::kUInt16: put(static_cast<uint16_t>(x)); break;
      case wire::DType::kUInt32: put(static_cast<uint32_t>(x)); break;
      case wire::DType::kFloat32: put(static_cast<float>(x)); break;
      case wire::DType::kFloat64: put(x); break;
      case wire::DType::kFloat16: throw std::runtime_error("float16 values are not in the manifest");
    }
  }
  return out;
}

std::vector<int64_t> shape_of(const Json& shape) {
  std::vector<int64_t> dims;
  for (const Json& d : shape.array) dims.push_back(static_cast<int64_t>(d.number));
  return dims;
}

// Encodes a manifest case from its values with the generic encoder.
std::vector<uint8_t> encode_case(const Json& c) {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<std::string> names;
  for (const Json& a : c["arrays"].array) {
    storage.push_back(array_bytes(dtype_from_name(a["dtype"].string), a["values"]));
    names.push_back(a["name"].string);
  }
  std::vector<wire::ArrayRef> refs;
  for (std::size_t i = 0; i < storage.size(); ++i) {
    const Json& a = c["arrays"][i];
    refs.push_back(wire::ArrayRef{names[i], dtype_from_name(a["dtype"].string), wire::Shape::of(shape_of(a["shape"])),
                                  storage[i].data()});
  }
  wire::Header h;
  h.kind = static_cast<wire::Kind>(static_cast<uint16_t>(c["kind"].number));
  h.sender_id = static_cast<uint32_t>(c["sender_id"].number);
  h.seq = static_cast<uint64_t>(c["seq"].number);
  h.policy_version = static_cast<uint64_t>(c["policy_version"].number);
  const std::string meta = c["meta"].is_null() ? std::string() : c["meta"].string;
  std::vector<uint8_t> out;
  wire::encode(h, refs.data(), refs.size(), meta, &out);
  return out;
}

// Checks a decoded message against its manifest entry.
void expect_matches(const wire::Message& m, const Json& c) {
  EXPECT_EQ(static_cast<uint16_t>(m.header.kind), c["kind"].number);
  EXPECT_EQ(m.header.sender_id, c["sender_id"].number);
  EXPECT_EQ(m.header.seq, c["seq"].number);
  EXPECT_EQ(m.header.policy_version, c["policy_version"].number);
  EXPECT_EQ(std::string(m.meta), c["meta"].is_null() ? std::string() : c["meta"].string);
  ASSERT_EQ(m.arrays.size(), c["arrays"].array.size());
  for (std::size_t i = 0; i < m.arrays.size(); ++i) {
    const Json& want = c["arrays"][i];
    const wire::ArrayView& got = m.arrays[i];
    EXPECT_EQ(got.name, want["name"].string);
    EXPECT_EQ(std::string(wire::dtype_name(got.dtype)), want["dtype"].string);
    EXPECT_TRUE(got.shape == wire::Shape::of(shape_of(want["shape"]))) << got.name << " " << got.shape.str();
    const std::vector<uint8_t> bytes = array_bytes(got.dtype, want["values"]);
    ASSERT_EQ(got.nbytes, bytes.size()) << got.name;
    EXPECT_EQ(0, std::memcmp(got.data, bytes.data(), bytes.size())) << got.name;
    EXPECT_EQ(got.offset % 64, 0u) << got.name;
  }
}

const char* const kClientEncodedCases[] = {"client_hello",        "act_first",    "act_step_uint8", "act_last_truncated",
                                           "act_last_terminated", "client_stats", "bye"};
const char* const kClientDecodedCases[] = {"action_discrete", "action_box", "action_ack", "client_hello_reply", "error"};

TEST(ClientWireGolden, ManifestHasEveryClientCase) {
  for (const char* name : kClientEncodedCases) EXPECT_EQ(manifest().object.count(name), 1u) << name;
  for (const char* name : kClientDecodedCases) EXPECT_EQ(manifest().object.count(name), 1u) << name;
}

TEST(ClientWireGolden, EncodingEveryCaseFromItsValuesGivesTheGoldenBytes) {
  for (const auto& [name, c] : manifest().object) {
    SCOPED_TRACE(name);
    const std::vector<uint8_t> want = golden(name);
    EXPECT_EQ(want.size(), c["length"].number);
    EXPECT_EQ(encode_case(c), want);
  }
}

TEST(ClientWireGolden, DecodingEveryGoldenFrameGivesItsValues) {
  for (const auto& [name, c] : manifest().object) {
    SCOPED_TRACE(name);
    const std::vector<uint8_t> bytes = golden(name);
    wire::Message m;
    wire::decode(bytes.data(), bytes.size(), &m);
    expect_matches(m, c);
  }
}

// The functions Client sends with, called as Client calls them.
TEST(ClientWireGolden, ClientMessageEncodersGiveTheGoldenBytes) {
  std::vector<uint8_t> out;
  const std::string meta = zrl::detail::hello_meta("golden", zrl::ObsSpec{{4}}, zrl::ActionSpec::discrete(2));
  EXPECT_EQ(meta, manifest()["client_hello"]["meta"].string);
  wire::encode_hello(0, meta, &out);
  EXPECT_EQ(out, golden("client_hello"));

  const float obs_first[4] = {0.1f, 0.2f, 0.3f, 0.4f};
  const wire::ArrayRef first{"obs", wire::DType::kFloat32, wire::Shape::of({4}), obs_first};
  wire::encode_act(1, wire::kFlagFirst, 0.0f, &first, &out);
  EXPECT_EQ(out, golden("act_first"));

  uint8_t pixels[12];
  for (int i = 0; i < 12; ++i) pixels[i] = static_cast<uint8_t>(i);
  const wire::ArrayRef step{"obs", wire::DType::kUInt8, wire::Shape::of({3, 4}), pixels};
  wire::encode_act(2, 0, 1.5f, &step, &out);
  EXPECT_EQ(out, golden("act_step_uint8"));

  const float obs_final[4] = {1.0f, -1.0f, 0.5f, 0.0f};
  const wire::ArrayRef final_obs{"obs", wire::DType::kFloat32, wire::Shape::of({4}), obs_final};
  wire::encode_act(3, wire::kFlagLast | wire::kFlagTruncated, 1.0f, &final_obs, &out);
  EXPECT_EQ(out, golden("act_last_truncated"));

  wire::encode_act(4, wire::kFlagLast, -1.0f, nullptr, &out);
  EXPECT_EQ(out, golden("act_last_terminated"));

  wire::encode_stats(5, "score", 42.0, &out);
  EXPECT_EQ(out, golden("client_stats"));

  wire::encode_bye(6, &out);
  EXPECT_EQ(out, golden("bye"));
}

TEST(ClientWireGolden, DecodesTheServerReplies) {
  wire::Message m;
  std::vector<uint8_t> b = golden("action_discrete");
  wire::decode(b.data(), b.size(), &m);
  EXPECT_EQ(m.header.kind, wire::Kind::kAction);
  EXPECT_EQ(m.header.seq, 2u);
  EXPECT_EQ(m.header.policy_version, 12u);
  ASSERT_EQ(m.arrays.size(), 1u);
  EXPECT_EQ(m.arrays[0].name, "action");
  EXPECT_EQ(m.arrays[0].dtype, wire::DType::kInt64);
  EXPECT_EQ(m.arrays[0].shape.ndim, 0);
  int64_t index;
  std::memcpy(&index, m.arrays[0].data, 8);
  EXPECT_EQ(index, 1);

  b = golden("action_box");
  wire::decode(b.data(), b.size(), &m);
  ASSERT_EQ(m.arrays.size(), 1u);
  EXPECT_EQ(m.arrays[0].dtype, wire::DType::kFloat32);
  EXPECT_EQ(m.arrays[0].shape.str(), "(2,)");
  float values[2];
  std::memcpy(values, m.arrays[0].data, 8);
  EXPECT_EQ(values[0], 0.5f);
  EXPECT_EQ(values[1], -0.25f);

  b = golden("action_ack");
  wire::decode(b.data(), b.size(), &m);
  EXPECT_EQ(m.header.kind, wire::Kind::kAction);
  EXPECT_EQ(m.header.seq, 3u);
  EXPECT_TRUE(m.arrays.empty());

  b = golden("client_hello_reply");
  wire::decode(b.data(), b.size(), &m);
  EXPECT_EQ(m.header.kind, wire::Kind::kHelloReply);
  EXPECT_EQ(m.header.policy_version, 3u);
  EXPECT_EQ(m.meta, R"({"ok":true,"client_id":7,"policy_version":3})");

  b = golden("error");
  wire::decode(b.data(), b.size(), &m);
  EXPECT_EQ(m.header.kind, wire::Kind::kError);
  EXPECT_EQ(m.meta, "observation spec differs: expected float32[4]");
}

// ---------------------------------------------------------------------------
// Corrupted frames

std::string reject_reason(const std::vector<uint8_t>& frame, std::size_t max_bytes = wire::kDefaultMaxBytes) {
  wire::Message m;
  try {
    wire::decode(frame.data(), frame.size(), &m, max_bytes);
  } catch (const zrl::ProtocolError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(e.reason() + ": ", 0), 0u) << e.what();
    return e.reason();
  }
  return "accepted";
}

template <typename T>
void poke(std::vector<uint8_t>* frame, std::size_t offset, T value) {
  std::memcpy(frame->data() + offset, &value, sizeof(T));  // the host is little-endian (wire.h)
}

// Offsets inside the first descriptor (docs/PROTOCOL.md, "Array descriptor").
constexpr std::size_t kDesc0 = wire::kHeaderSize;

TEST(ClientWireDecode, RejectsCorruptedFramesWithTheirReason) {
  const std::vector<uint8_t> good = golden("act_first");  // obs float32 [4], reward, flags
  ASSERT_EQ(reject_reason(good), "accepted");
  struct Case {
    const char* what;
    std::function<void(std::vector<uint8_t>*)> corrupt;
    const char* reason;
  };
  const std::vector<Case> cases = {
      {"shorter than a header", [](auto* f) { f->resize(47); }, "too_short"},
      {"empty", [](auto* f) { f->clear(); }, "too_short"},
      {"truncated (total_len says more)", [](auto* f) { f->resize(f->size() - 1); }, "bad_length"},
      {"trailing byte", [](auto* f) { f->push_back(0); }, "bad_length"},
      {"bad magic", [](auto* f) { (*f)[0] = 'X'; }, "bad_magic"},
      {"bad version", [](auto* f) { poke<uint16_t>(f, 4, 2); }, "bad_version"},
      {"unknown kind", [](auto* f) { poke<uint16_t>(f, 6, 99); }, "bad_kind"},
      {"header flags set", [](auto* f) { poke<uint32_t>(f, 36, 1); }, "bad_header"},
      {"too many arrays", [](auto* f) { poke<uint32_t>(f, 12, 65); }, "bad_header"},
      {"meta runs past the end", [](auto* f) { poke<uint32_t>(f, 32, 1000); }, "bad_length"},
      {"descriptors run past the end", [](auto* f) { poke<uint32_t>(f, 12, 6); }, "bad_length"},
      {"bad dtype code", [](auto* f) { (*f)[kDesc0 + 32] = 99; }, "bad_dtype"},
      {"dtype code 0", [](auto* f) { (*f)[kDesc0 + 32] = 0; }, "bad_dtype"},
      {"nbytes mismatch", [](auto* f) { poke<uint64_t>(f, kDesc0 + 72, 12); }, "bad_length"},
      {"shape disagrees with nbytes", [](auto* f) { poke<uint32_t>(f, kDesc0 + 40, 5); }, "bad_length"},
      {"overflowing shape", [](auto* f) {
         (*f)[kDesc0 + 33] = 6;
         for (int k = 0; k < 6; ++k) poke<uint32_t>(f, kDesc0 + 40 + 4 * k, 0xFFFFFFFFu);
       }, "bad_length"},
      {"out-of-bounds offset", [](auto* f) { poke<uint64_t>(f, kDesc0 + 64, 448); }, "bad_length"},
      {"huge offset", [](auto* f) { poke<uint64_t>(f, kDesc0 + 64, ~uint64_t{0} - 3); }, "bad_length"},
      {"offset inside the descriptors", [](auto* f) { poke<uint64_t>(f, kDesc0 + 64, 64); }, "bad_length"},
      {"misaligned offset", [](auto* f) { poke<uint64_t>(f, kDesc0 + 64, 322); }, "bad_descriptor"},
      {"ndim > 6", [](auto* f) { (*f)[kDesc0 + 33] = 7; }, "bad_descriptor"},
      {"unused dim not zero", [](auto* f) { poke<uint32_t>(f, kDesc0 + 44, 1); }, "bad_descriptor"},
      {"reserved u16 not zero", [](auto* f) { (*f)[kDesc0 + 34] = 1; }, "bad_descriptor"},
      {"reserved u32 not zero", [](auto* f) { (*f)[kDesc0 + 38] = 1; }, "bad_descriptor"},
      {"empty name", [](auto* f) { std::memset(f->data() + kDesc0, 0, 32); }, "bad_descriptor"},
      {"NUL inside the name", [](auto* f) { (*f)[kDesc0 + 1] = 0; }, "bad_descriptor"},
      {"name not UTF-8", [](auto* f) { (*f)[kDesc0] = static_cast<uint8_t>(0xFF); }, "bad_descriptor"},
      {"duplicate name", [](auto* f) {
         std::memcpy(f->data() + kDesc0 + wire::kDescriptorSize, "obs\0\0\0", 6);
       }, "bad_descriptor"},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> frame = good;
    c.corrupt(&frame);
    EXPECT_EQ(reject_reason(frame), c.reason) << c.what;
  }
  EXPECT_EQ(reject_reason(good, good.size() - 1), "too_large");
}

TEST(ClientWireDecode, EveryTruncationIsRejected) {
  const std::vector<uint8_t> good = golden("action_box");
  for (std::size_t n = 0; n < good.size(); ++n) {
    const std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_NE(reject_reason(cut), "accepted") << n << " bytes";
  }
}

TEST(ClientWireDecode, AcceptsGapsBetweenArraysAndAlignmentToTheItemSizeOnly) {
  // Readers require offsets aligned to the item size, not to 64 (PROTOCOL.md):
  // move `obs` (float32, at 320) to 324 inside a frame grown to fit.
  std::vector<uint8_t> f = golden("act_first");
  std::vector<uint8_t> moved = f;
  std::memmove(moved.data() + 324, f.data() + 320, 16);
  poke<uint64_t>(&moved, kDesc0 + 64, 324);
  wire::Message m;
  wire::decode(moved.data(), moved.size(), &m);
  float first;
  std::memcpy(&first, m.arrays[0].data, 4);
  EXPECT_EQ(first, 0.1f);
}

TEST(ClientWireEncode, RejectsBadNamesAndTooManyArrays) {
  std::vector<uint8_t> out;
  const uint8_t x = 0;
  const wire::ArrayRef empty{"", wire::DType::kUInt8, wire::Shape{}, &x};
  EXPECT_THROW(wire::encode(wire::Header{}, &empty, 1, {}, &out), zrl::UsageError);
  const std::string long_name(32, 'a');
  const wire::ArrayRef too_long{long_name, wire::DType::kUInt8, wire::Shape{}, &x};
  EXPECT_THROW(wire::encode(wire::Header{}, &too_long, 1, {}, &out), zrl::UsageError);
  const wire::ArrayRef twice[2] = {{"a", wire::DType::kUInt8, wire::Shape{}, &x}, {"a", wire::DType::kUInt8, wire::Shape{}, &x}};
  EXPECT_THROW(wire::encode(wire::Header{}, twice, 2, {}, &out), zrl::UsageError);
  std::vector<std::string> names;
  for (int i = 0; i < 65; ++i) names.push_back("a" + std::to_string(i));
  std::vector<wire::ArrayRef> many;
  for (const std::string& n : names) many.push_back({n, wire::DType::kUInt8, wire::Shape{}, &x});
  EXPECT_THROW(wire::encode(wire::Header{}, many.data(), many.size(), {}, &out), zrl::UsageError);
  EXPECT_NO_THROW(wire::encode(wire::Header{}, many.data(), 64, {}, &out));
  EXPECT_THROW(wire::Shape::of({1, 2, 3, 4, 5, 6, 7}), zrl::UsageError);
}

// ---------------------------------------------------------------------------
// The hello's JSON, against strings Python printed:
//   json.dumps(d, separators=(",", ":")) and repr(float).

TEST(ClientHelloJson, FloatsAreWrittenAsPythonsRepr) {
  const std::vector<std::pair<double, const char*>> cases = {
      {0.0, "0.0"},
      {-0.0, "-0.0"},
      {1.0, "1.0"},
      {-1.0, "-1.0"},
      {0.1, "0.1"},
      {1e16, "1e+16"},
      {1e15, "1000000000000000.0"},
      {1234567890123456.0, "1234567890123456.0"},
      {12345678901234567.0, "1.2345678901234568e+16"},
      {1e-4, "0.0001"},
      {1e-5, "1e-05"},
      {2.5e-7, "2.5e-07"},
      {3.14159, "3.14159"},
      {1e300, "1e+300"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {100.0, "100.0"},
      {123456.789, "123456.789"},
      {-2.0, "-2.0"},
      {0.30000000000000004, "0.30000000000000004"},
      {1e22, "1e+22"},
      {1.5e-10, "1.5e-10"},
      {0.001, "0.001"},
      {std::sqrt(2.0), "1.4142135623730951"},
      {1e100, "1e+100"},
      {9007199254740993.0, "9007199254740992.0"},
  };
  for (const auto& [value, want] : cases) EXPECT_EQ(zrl::detail::python_float_repr(value), want) << want;
  EXPECT_THROW(zrl::detail::python_float_repr(std::nan("")), zrl::UsageError);
  EXPECT_THROW(zrl::detail::python_float_repr(INFINITY), zrl::UsageError);
}

TEST(ClientHelloJson, StringsAreEscapedAsJsonDumps) {
  EXPECT_EQ(zrl::detail::json_string("golden"), "\"golden\"");
  EXPECT_EQ(zrl::detail::json_string("g\"ol\\den\n\t\x01\x7f \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"),
            R"("g\"ol\\den\n\t\u0001\u007f \u00e9\u20ac\ud83d\ude00")");
  EXPECT_THROW(zrl::detail::json_string("\xff"), zrl::UsageError);
}

TEST(ClientHelloJson, HelloMetaMatchesPythonForBoxesAndBounds) {
  EXPECT_EQ(zrl::detail::hello_meta("sim \xc3\xa9\"1\\ \xf0\x9f\x98\x80", zrl::ObsSpec{{84, 84, 4}, zrl::ObsDType::kUInt8},
                                    zrl::ActionSpec::box({2}, -1.0, 0.1)),
            R"json({"role":"client","protocol":1,"name":"sim \u00e9\"1\\ \ud83d\ude00","obs_space":{"type":"box","shape":[84,84,4],"dtype":"uint8","low":null,"high":null},"action_space":{"type":"box","shape":[2],"dtype":"float32","low":-1.0,"high":0.1}})json");
  EXPECT_EQ(zrl::detail::hello_meta("", zrl::ObsSpec{{}, zrl::ObsDType::kFloat32, -1e-05, 1e16},
                                    zrl::ActionSpec::box({2, 3}, std::nullopt, 2.5)),
            R"json({"role":"client","protocol":1,"name":"","obs_space":{"type":"box","shape":[],"dtype":"float32","low":-1e-05,"high":1e+16},"action_space":{"type":"box","shape":[2,3],"dtype":"float32","low":null,"high":2.5}})json");
}

}  // namespace
