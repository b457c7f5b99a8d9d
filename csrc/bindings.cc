// The pybind11 module zrl._core: argument conversion and error mapping only.
// Every kernel lives in a plain C++ library that knows nothing of Python;
// long-running calls release the GIL here.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <structmember.h>  // T_OBJECT_EX (Python.h has it as Py_T_OBJECT_EX from 3.12 only)

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "int8_gemm.h"
#include "pixels.h"
#include "quantize.h"
#include "sample.h"
#include "replay/replay.h"
#include "vtrace.h"
#include "wire_gate.h"
#include "zmq_native.h"

namespace py = pybind11;

namespace {

using FloatArray = py::array_t<float, py::array::c_style>;

// Whether `got` is `want`: the same kind and size in this machine's byte order. (Not
// dtype identity: an unpickled float32 array, or np.longlong for int64, has another
// dtype object of the same type.)
bool is_dtype(const py::dtype& got, const py::dtype& want) {
  const char order = got.byteorder();
  return got.kind() == want.kind() && got.itemsize() == want.itemsize() &&
         (order == '=' || order == '|' || order == want.byteorder());
}

// 2-byte integers holding bfloat16 bits, in this machine's byte order.
bool is_bf16_bits(const py::dtype& dt) {
  const char order = dt.byteorder();
  return (dt.kind() == 'i' || dt.kind() == 'u') && dt.itemsize() == 2 && (order == '=' || order == '|' || order == '<');
}

// A float32 array of exactly `ndim` dims, C-contiguous (copied if it was not).
// Errors name the Python argument, so the user knows which one is wrong.
FloatArray as_float32(const py::handle& obj, const char* name, py::ssize_t ndim) {
  if (!py::isinstance<py::array>(obj))
    throw py::value_error(std::string(name) + ": expected a numpy array, got " +
                          std::string(py::str(py::type::of(obj).attr("__name__"))));
  auto arr = py::reinterpret_borrow<py::array>(obj);
  if (!is_dtype(arr.dtype(), py::dtype::of<float>()))
    throw py::value_error(std::string(name) + ": expected dtype float32, got " +
                          std::string(py::str(arr.dtype())));
  if (arr.ndim() != ndim)
    throw py::value_error(std::string(name) + ": expected " + std::to_string(ndim) +
                          " dimensions, got " + std::to_string(arr.ndim()));
  return FloatArray::ensure(arr);
}

// The kernels below read and write through raw pointers of their element type.
void require_aligned(const py::array& arr, const char* name) {
  if (!(arr.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_))
    throw py::value_error(std::string(name) + ": array is not aligned");
}

// uint8 [N, C, H, W] -> [N, H, W, C] float32, bfloat16 or uint8 (out: float32, uint8, or 2-byte ints holding
// bf16 bits, as PyTorch's tensor.view(torch.int16).numpy() gives them).
void pixels_to_channels_last(const py::handle& src_obj, const py::handle& out_obj) {
  if (!py::isinstance<py::array>(src_obj) || !py::isinstance<py::array>(out_obj))
    throw py::value_error("pixels_to_channels_last: src and out must be numpy arrays");
  auto src = py::reinterpret_borrow<py::array>(src_obj);
  auto out = py::reinterpret_borrow<py::array>(out_obj);
  if (!is_dtype(src.dtype(), py::dtype::of<std::uint8_t>()))
    throw py::value_error("src: expected dtype uint8, got " + std::string(py::str(src.dtype())));
  if (src.ndim() != 4 || out.ndim() != 4)
    throw py::value_error("src and out: expected 4 dimensions ([N, C, H, W] and [N, H, W, C])");
  const py::ssize_t n = src.shape(0), c = src.shape(1), h = src.shape(2), w = src.shape(3);
  if (out.shape(0) != n || out.shape(1) != h || out.shape(2) != w || out.shape(3) != c)
    throw py::value_error("out: expected shape (" + std::to_string(n) + ", " + std::to_string(h) +
                          ", " + std::to_string(w) + ", " + std::to_string(c) + ") for src's [N, C, H, W]");
  auto check_layout = [](const py::array& arr, const char* name) {
    if (!(arr.flags() & py::array::c_style))
      throw py::value_error(std::string(name) + ": expected a C-contiguous array");
    require_aligned(arr, name);
  };
  check_layout(src, "src");
  check_layout(out, "out");
  if (!out.writeable()) throw py::value_error("out: array is read-only");
  const bool f32 = is_dtype(out.dtype(), py::dtype::of<float>());
  const bool u8 = is_dtype(out.dtype(), py::dtype::of<std::uint8_t>());
  const bool bf16 = is_bf16_bits(out.dtype());
  if (!f32 && !u8 && !bf16)
    throw py::value_error("out: expected float32, uint8, or int16/uint16 holding bfloat16 bits; got " +
                          std::string(py::str(out.dtype())));
  const auto* s = static_cast<const std::uint8_t*>(src.data());
  void* d = out.mutable_data();
  py::gil_scoped_release release;
  if (f32)
    zrl::planes_to_channels_last(s, n, c, static_cast<std::size_t>(h * w), static_cast<float*>(d));
  else if (u8)
    zrl::planes_to_channels_last_u8(s, n, c, static_cast<std::size_t>(h * w), static_cast<std::uint8_t*>(d));
  else
    zrl::planes_to_channels_last_bf16(s, n, c, static_cast<std::size_t>(h * w),
                                      static_cast<std::uint16_t*>(d));
}

// Weights [R, K] float32 (or int16/uint16 holding bfloat16 bits) -> out int8 [R, K] and scales
// float32 [R]: per-row int8 quantization (see quantize.h). Returns false if a weight is not finite.
bool quantize_rows(const py::handle& src_obj, const py::handle& out_obj, const py::handle& scales_obj) {
  if (!py::isinstance<py::array>(src_obj) || !py::isinstance<py::array>(out_obj) || !py::isinstance<py::array>(scales_obj))
    throw py::value_error("quantize_rows: src, out and scales must be numpy arrays");
  auto src = py::reinterpret_borrow<py::array>(src_obj);
  auto out = py::reinterpret_borrow<py::array>(out_obj);
  auto scales = py::reinterpret_borrow<py::array>(scales_obj);
  const bool f32 = is_dtype(src.dtype(), py::dtype::of<float>());
  const bool bf16 = is_bf16_bits(src.dtype());
  if (!f32 && !bf16)
    throw py::value_error("src: expected float32, or int16/uint16 holding bfloat16 bits; got " + std::string(py::str(src.dtype())));
  if (!is_dtype(out.dtype(), py::dtype::of<std::int8_t>()))
    throw py::value_error("out: expected dtype int8, got " + std::string(py::str(out.dtype())));
  if (!is_dtype(scales.dtype(), py::dtype::of<float>()))
    throw py::value_error("scales: expected dtype float32, got " + std::string(py::str(scales.dtype())));
  if (src.ndim() != 2 || out.ndim() != 2 || scales.ndim() != 1)
    throw py::value_error("quantize_rows: expected src [R, K], out [R, K] and scales [R]");
  const py::ssize_t r = src.shape(0), k = src.shape(1);
  if (out.shape(0) != r || out.shape(1) != k || scales.shape(0) != r)
    throw py::value_error("quantize_rows: out must be [" + std::to_string(r) + ", " + std::to_string(k) + "] and scales [" +
                          std::to_string(r) + "] for src's [R, K]");
  for (const auto* a : {&src, &out, &scales}) {
    if (!(a->flags() & py::array::c_style)) throw py::value_error("quantize_rows: arrays must be C-contiguous");
    require_aligned(*a, "quantize_rows");
  }
  if (!out.writeable() || !scales.writeable()) throw py::value_error("quantize_rows: out and scales must be writable");
  const void* s = src.data();
  auto* o = static_cast<std::int8_t*>(out.mutable_data());
  auto* sc = static_cast<float*>(scales.mutable_data());
  py::gil_scoped_release release;
  const auto R = static_cast<std::size_t>(r), K = static_cast<std::size_t>(k);
  return f32 ? zrl::quantize_rows_int8(static_cast<const float*>(s), R, K, o, sc)
             : zrl::quantize_rows_int8_bf16(static_cast<const std::uint16_t*>(s), R, K, o, sc);
}

// One int8 layer (see int8_gemm.h): x uint8 (any shape, C-contiguous), base int64 [P], w int8
// [OC / 16, J, 64] (blocks of 16 outputs x 4 bytes per run), offs int32 [J], scale and bias float32 [OC], out uint8 or float32 [P, OC]. Every
// run base[p] + offs[j] .. + 4 must lie inside x (checked; the kernel then runs without the
// GIL, so base and offs must not change under it). kernel: "auto" (the fastest this CPU runs),
// or one by name, for tests ("avx512_vnni", "avx2", "portable"; a ValueError where it cannot run).
constexpr py::ssize_t kMaxInt8LayerJ = INT32_MAX / (4 * 255 * 127);
constexpr zrl::Int8Kernel kInt8Kernels[] = {zrl::Int8Kernel::kAvx512Vnni, zrl::Int8Kernel::kAvx2, zrl::Int8Kernel::kPortable};

zrl::Int8Kernel int8_kernel_named(const std::string& name) {
  if (name == "auto") return zrl::Int8Kernel::kAuto;
  for (zrl::Int8Kernel k : kInt8Kernels) {
    if (name != zrl::int8_kernel_name(k)) continue;
    if (!zrl::int8_kernel_runs(k)) throw py::value_error("int8_layer: the " + name + " kernel does not run on this CPU");
    return k;
  }
  throw py::value_error("int8_layer: kernel must be auto, avx512_vnni, avx2 or portable, got " + name);
}

// The kernels this CPU runs, fastest first (the first is the one "auto" picks).
py::list int8_layer_kernels() {
  py::list out;
  for (zrl::Int8Kernel k : kInt8Kernels)
    if (zrl::int8_kernel_runs(k)) out.append(zrl::int8_kernel_name(k));
  return out;
}
void int8_layer(const py::handle& x_obj, const py::handle& base_obj, const py::handle& w_obj, const py::handle& offs_obj,
                const py::handle& scale_obj, const py::handle& bias_obj, float inv_out_scale, int qmax,
                const py::handle& out_obj, const std::string& kernel) {
  auto arr = [](const py::handle& h, const char* name) {
    if (!py::isinstance<py::array>(h)) throw py::value_error(std::string("int8_layer: ") + name + " must be a numpy array");
    auto a = py::reinterpret_borrow<py::array>(h);
    if (!(a.flags() & py::array::c_style)) throw py::value_error(std::string("int8_layer: ") + name + " must be C-contiguous");
    require_aligned(a, name);
    return a;
  };
  auto x = arr(x_obj, "x"), base = arr(base_obj, "base"), w = arr(w_obj, "w"), offs = arr(offs_obj, "offs");
  auto scale = arr(scale_obj, "scale"), bias = arr(bias_obj, "bias"), out = arr(out_obj, "out");
  auto want = [](const py::array& a, const py::dtype& dt, const char* name) {
    if (!is_dtype(a.dtype(), dt)) throw py::value_error(std::string("int8_layer: ") + name + " has dtype " + std::string(py::str(a.dtype())));
  };
  want(x, py::dtype::of<std::uint8_t>(), "x");
  want(base, py::dtype::of<std::int64_t>(), "base");
  want(w, py::dtype::of<std::int8_t>(), "w");
  want(offs, py::dtype::of<std::int32_t>(), "offs");
  want(scale, py::dtype::of<float>(), "scale");
  want(bias, py::dtype::of<float>(), "bias");
  const bool u8 = is_dtype(out.dtype(), py::dtype::of<std::uint8_t>());
  if (!u8 && !is_dtype(out.dtype(), py::dtype::of<float>())) throw py::value_error("int8_layer: out must be uint8 or float32");
  if (w.ndim() != 3 || w.shape(2) != 64 || base.ndim() != 1 || offs.ndim() != 1 || offs.shape(0) != w.shape(1))
    throw py::value_error("int8_layer: expected w [OC / 16, J, 64], base [P] and offs [J]");
  const py::ssize_t P = base.shape(0), J = w.shape(1), OC = 16 * w.shape(0);
  if (scale.ndim() != 1 || scale.shape(0) != OC || bias.ndim() != 1 || bias.shape(0) != OC)
    throw py::value_error("int8_layer: scale and bias must be [OC]");
  if (out.ndim() != 2 || out.shape(0) != P || out.shape(1) != OC)
    throw py::value_error("int8_layer: out must be [" + std::to_string(P) + ", " + std::to_string(OC) + "]");
  if (!out.writeable()) throw py::value_error("int8_layer: out must be writable");
  if (u8 && (qmax < 0 || qmax > 255)) throw py::value_error("int8_layer: qmax must be in [0, 255]");
  const auto* b = static_cast<const std::int64_t*>(base.data());
  const auto* o = static_cast<const std::int32_t*>(offs.data());
  // Each output sums 4 * J products of up to 255 x 127 in int32 (the portable loop exactly).
  if (J > kMaxInt8LayerJ)
    throw py::value_error("int8_layer: J " + std::to_string(J) + " > " + std::to_string(kMaxInt8LayerJ) +
                          ": the int32 sums could overflow");
  if (P > 0 && J > 0) {
    const auto [bl, bh] = std::minmax_element(b, b + P);
    const auto [ol, oh] = std::minmax_element(o, o + J);
    // In 128 bits: a hostile base near INT64_MAX must not wrap past the check.
    if (static_cast<__int128>(*bl) + *ol < 0 || static_cast<__int128>(*bh) + *oh + 4 > static_cast<__int128>(x.size()))
      throw py::value_error("int8_layer: base + offs reach outside x");
  }
  const zrl::Int8Layer layer{static_cast<const std::int8_t*>(w.data()), static_cast<std::size_t>(J), static_cast<std::size_t>(OC), o,
                             static_cast<const float*>(scale.data()), static_cast<const float*>(bias.data())};
  const auto* xp = static_cast<const std::uint8_t*>(x.data());
  auto* out_u8 = u8 ? static_cast<std::uint8_t*>(out.mutable_data()) : nullptr;
  auto* out_f32 = u8 ? nullptr : static_cast<float*>(out.mutable_data());
  const zrl::Int8Kernel k = int8_kernel_named(kernel);
  py::gil_scoped_release release;
  zrl::int8_layer(xp, b, static_cast<std::size_t>(P), layer, inv_out_scale, qmax, out_u8, out_f32, k);
}

// Categorical draws from logits [B, n] float32 with uniforms u [B] float64: (actions int64 [B],
// log-probabilities float32 [B]). See sample.h.
py::tuple sample_categorical(const py::handle& logits_obj, const py::handle& u_obj) {
  FloatArray logits = as_float32(logits_obj, "logits", 2);
  require_aligned(logits, "logits");
  if (!py::isinstance<py::array>(u_obj)) throw py::value_error("u: expected a numpy array");
  auto u_arr = py::reinterpret_borrow<py::array>(u_obj);
  if (!is_dtype(u_arr.dtype(), py::dtype::of<double>()) || u_arr.ndim() != 1)
    throw py::value_error("u: expected a float64 array of 1 dimension");
  require_aligned(u_arr, "u");
  auto u = py::array_t<double, py::array::c_style>::ensure(u_arr);  // a copy only if strided
  const py::ssize_t b = logits.shape(0), n = logits.shape(1);
  if (u.shape(0) != b)
    throw py::value_error("u: expected " + std::to_string(b) + " draws (one per row of logits), got " +
                          std::to_string(u.shape(0)));
  if (n < 1) throw py::value_error("logits: expected at least one action per row");
  for (py::ssize_t i = 0; i < b; ++i) {
    const double v = u.data()[i];
    if (!(v >= 0.0 && v < 1.0)) throw py::value_error("u: draws must be in [0, 1), got " + std::to_string(v));
  }
  py::array_t<std::int64_t> actions(b);
  py::array_t<float> logp(b);
  std::size_t done;
  {
    py::gil_scoped_release release;
    done = zrl::sample_categorical(logits.data(), static_cast<std::size_t>(b), static_cast<std::size_t>(n),
                                   u.data(), actions.mutable_data(), logp.mutable_data());
  }
  if (done != static_cast<std::size_t>(b))
    throw py::value_error("logits: row " + std::to_string(done) +
                          " has a NaN or +inf logit, or every logit -inf: no action can be drawn from it");
  return py::make_tuple(actions, logp);
}

py::tuple vtrace(const py::handle& log_rhos_obj, const py::handle& discounts_obj,
                 const py::handle& rewards_obj, const py::handle& values_obj,
                 const py::handle& bootstrap_obj, float clip_rho_threshold,
                 float clip_pg_rho_threshold, float clip_c_threshold, float lambda) {
  FloatArray log_rhos = as_float32(log_rhos_obj, "log_rhos", 2);
  const py::ssize_t T = log_rhos.shape(0), B = log_rhos.shape(1);
  if (T == 0 || B == 0)
    throw py::value_error("log_rhos: T and B must be positive, got shape (" +
                          std::to_string(T) + ", " + std::to_string(B) + ")");
  auto check_tb = [&](const py::handle& obj, const char* name) {
    FloatArray a = as_float32(obj, name, 2);
    if (a.shape(0) != T || a.shape(1) != B)
      throw py::value_error(std::string(name) + ": expected shape (" + std::to_string(T) +
                            ", " + std::to_string(B) + ") like log_rhos, got (" +
                            std::to_string(a.shape(0)) + ", " + std::to_string(a.shape(1)) +
                            ")");
    return a;
  };
  FloatArray discounts = check_tb(discounts_obj, "discounts");
  FloatArray rewards = check_tb(rewards_obj, "rewards");
  FloatArray values = check_tb(values_obj, "values");
  FloatArray bootstrap = as_float32(bootstrap_obj, "bootstrap_value", 1);
  if (bootstrap.shape(0) != B)
    throw py::value_error("bootstrap_value: expected shape (" + std::to_string(B) +
                          ",), got (" + std::to_string(bootstrap.shape(0)) + ",)");
  auto positive = [](float x, const char* name) {
    if (!(x > 0.0f)) throw py::value_error(std::string(name) + ": must be > 0 (or None)");
  };
  positive(clip_rho_threshold, "clip_rho_threshold");
  positive(clip_pg_rho_threshold, "clip_pg_rho_threshold");
  positive(clip_c_threshold, "clip_c_threshold");
  if (!(lambda >= 0.0f && lambda <= 1.0f)) throw py::value_error("lambda_: must be in [0, 1]");

  FloatArray vs({T, B});
  FloatArray pg({T, B});
  zrl::VTraceParams params{clip_rho_threshold, clip_pg_rho_threshold, clip_c_threshold, lambda};
  {
    py::gil_scoped_release release;
    zrl::vtrace_from_importance_weights(log_rhos.data(), discounts.data(), rewards.data(),
                                        values.data(), bootstrap.data(),
                                        static_cast<std::size_t>(T), static_cast<std::size_t>(B),
                                        params, vs.mutable_data(), pg.mutable_data());
  }
  return py::make_tuple(std::move(vs), std::move(pg));
}

// ---------------------------------------------------------------------------
// Replay (csrc/replay/): zrl.replay.PrioritizedReplay / UniformReplay wrap
// these. Arrays are checked and made contiguous here with the GIL held; the
// C++ call then runs with the GIL released (it takes the buffer's own mutex
// and never calls back into Python, so the two locks cannot deadlock).

py::dtype numpy_dtype(zrl::DType dtype) {
  switch (dtype) {
    case zrl::DType::kFloat32:
      return py::dtype::of<float>();
    case zrl::DType::kUInt8:
      return py::dtype::of<uint8_t>();
    case zrl::DType::kInt64:
      return py::dtype::of<int64_t>();
    case zrl::DType::kBool:
      return py::dtype::of<bool>();
  }
  throw std::logic_error("unknown dtype");
}

// Equal kind and size in native byte order; a swapped-order array is refused
// rather than stored as garbage.
std::string shape_str(const std::vector<py::ssize_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + (shape[i] < 0 ? std::string("N") : std::to_string(shape[i]));
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::string array_shape_str(const py::array& a) {
  return shape_str(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
}

std::string type_name(const py::handle& obj) {
  return std::string(py::str(py::type::of(obj).attr("__name__")));
}

// [(name, shape tuple, dtype name)] as normalised by zrl.replay.
std::vector<zrl::FieldSpec> field_specs(const py::handle& fields) {
  std::vector<zrl::FieldSpec> specs;
  for (const py::handle& item : py::iter(fields)) {
    auto t = py::reinterpret_borrow<py::tuple>(item);
    if (t.size() != 3) throw py::value_error("fields: expected (name, shape, dtype) triples");
    zrl::FieldSpec spec;
    spec.name = t[0].cast<std::string>();
    for (const py::handle& d : t[1]) spec.shape.push_back(d.cast<int64_t>());
    spec.dtype = zrl::dtype_from_name(t[2].cast<std::string>());
    specs.push_back(std::move(spec));
  }
  return specs;
}

std::vector<py::ssize_t> leading(py::ssize_t n, const zrl::FieldSpec& spec) {
  std::vector<py::ssize_t> shape{n};
  shape.insert(shape.end(), spec.shape.begin(), spec.shape.end());
  return shape;
}

// The arrays of an `add` batch, checked against the fields and kept alive
// (contiguous copies where needed) while the GIL is released.
struct BatchColumns {
  std::vector<py::array> arrays;
  std::vector<const void*> data;
  std::size_t rows = 0;
};

BatchColumns batch_columns(const py::handle& batch_obj, const std::vector<zrl::FieldSpec>& fields) {
  if (!py::isinstance<py::dict>(batch_obj))
    throw py::value_error("batch: expected a dict of numpy arrays, got " + type_name(batch_obj));
  auto batch = py::reinterpret_borrow<py::dict>(batch_obj);
  for (const auto& kv : batch) {
    const std::string key = py::str(kv.first);
    bool known = false;
    for (const auto& f : fields) known = known || f.name == key;
    if (!known) throw py::value_error("batch: unexpected field '" + key + "'");
  }
  BatchColumns cols;
  for (const auto& f : fields) {
    const std::string name = "batch['" + f.name + "']";
    if (!batch.contains(f.name)) throw py::value_error("batch: missing field '" + f.name + "'");
    py::object obj = batch[py::str(f.name)];
    if (!py::isinstance<py::array>(obj))
      throw py::value_error(name + ": expected a numpy array, got " + type_name(obj));
    auto arr = py::reinterpret_borrow<py::array>(obj);
    const py::dtype want = numpy_dtype(f.dtype);
    if (!is_dtype(arr.dtype(), want))
      throw py::value_error(name + ": expected dtype " + zrl::dtype_name(f.dtype) + ", got " +
                            std::string(py::str(arr.dtype())));
    bool shape_ok = arr.ndim() == py::ssize_t(f.shape.size()) + 1;
    for (std::size_t d = 0; shape_ok && d < f.shape.size(); ++d)
      shape_ok = arr.shape(d + 1) == f.shape[d];
    if (!shape_ok)
      throw py::value_error(name + ": expected shape " + shape_str(leading(-1, f)) + ", got " +
                            array_shape_str(arr));
    if (cols.arrays.empty()) {
      cols.rows = static_cast<std::size_t>(arr.shape(0));
    } else if (static_cast<std::size_t>(arr.shape(0)) != cols.rows) {
      throw py::value_error(name + ": has " + std::to_string(arr.shape(0)) + " rows but batch['" +
                            fields[0].name + "'] has " + std::to_string(cols.rows));
    }
    arr = py::array::ensure(arr, py::array::c_style);
    cols.data.push_back(arr.data());
    cols.arrays.push_back(std::move(arr));
  }
  return cols;
}

// A 1-D array of `n` numbers as float64 (any real dtype is converted).
py::array_t<double, py::array::c_style> as_float64_vector(const py::handle& obj, const char* name,
                                                          std::size_t n) {
  py::array arr = py::array::ensure(obj);
  if (!arr ||
      (arr.dtype().kind() != 'f' && arr.dtype().kind() != 'i' && arr.dtype().kind() != 'u')) {
    PyErr_Clear();
    throw py::value_error(std::string(name) + ": expected an array of real numbers");
  }
  if (arr.ndim() != 1 || static_cast<std::size_t>(arr.shape(0)) != n)
    throw py::value_error(std::string(name) + ": expected shape (" + std::to_string(n) +
                          ",), got " + array_shape_str(arr));
  return py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(arr);
}

py::array_t<int64_t, py::array::c_style> as_keys(const py::handle& obj) {
  py::array arr = py::array::ensure(obj);
  if (!arr || (arr.dtype().kind() != 'i' && arr.dtype().kind() != 'u')) {
    PyErr_Clear();
    throw py::value_error("keys: expected an array of integer keys as returned by sample");
  }
  if (arr.ndim() != 1)
    throw py::value_error("keys: expected shape (N,), got " + array_shape_str(arr));
  return py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
}

std::size_t positive_batch_size(py::ssize_t batch_size) {
  if (batch_size <= 0)
    throw py::value_error("batch_size: must be positive, got " + std::to_string(batch_size));
  return static_cast<std::size_t>(batch_size);
}

// Freshly allocated [n, *shape] arrays for every field, and their pointers:
// views into one new block, each field 64-byte aligned. One allocation
// instead of one per field; and a block of 4 MB or more is one numpy puts on
// huge pages, so a batch of Atari frames costs a few page faults, not
// thousands (faulting in fresh output pages was most of such a sample).
py::dict new_batch(const std::vector<zrl::FieldSpec>& fields, std::size_t n,
                   std::vector<void*>& data) {
  std::vector<std::size_t> offsets;
  std::size_t total = 0;
  for (const auto& f : fields) {
    offsets.push_back(total);
    total += (n * f.item_bytes() + 63) / 64 * 64;
  }
  py::array_t<uint8_t> block(static_cast<py::ssize_t>(total + 64));
  uint8_t* base = block.mutable_data();
  base += (64 - reinterpret_cast<std::uintptr_t>(base) % 64) % 64;
  py::dict batch;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const auto& f = fields[i];
    py::array a(numpy_dtype(f.dtype), leading(py::ssize_t(n), f), {}, base + offsets[i], block);
    data.push_back(base + offsets[i]);
    batch[py::str(f.name)] = std::move(a);
  }
  return batch;
}

// A std::vector handed to numpy without a copy: the array owns it.
template <typename T>
py::array adopt(std::vector<T>&& v, const py::dtype& dtype, std::vector<py::ssize_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  py::capsule owner(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array(dtype, std::move(shape), {}, owned->data(), owner);
}

template <typename T>
py::array scalar_array(T value) {
  py::array_t<T> a(std::vector<py::ssize_t>{});
  *a.mutable_data() = value;
  return std::move(a);
}

// State dicts: flat {name: numpy array}, fields under "field/NAME".
constexpr int64_t kStateFormat = 1;

void put_storage_state(py::dict& d, zrl::StorageState&& st,
                       const std::vector<zrl::FieldSpec>& fields) {
  d["size"] = scalar_array<int64_t>(int64_t(st.size));
  d["cursor"] = scalar_array<int64_t>(int64_t(st.cursor));
  d["generations"] =
      adopt(std::move(st.generations), py::dtype::of<int64_t>(), {py::ssize_t(st.size)});
  for (std::size_t f = 0; f < fields.size(); ++f)
    d[py::str("field/" + fields[f].name)] =
        adopt(std::move(st.columns[f]), numpy_dtype(fields[f].dtype),
              leading(py::ssize_t(st.size), fields[f]));
}

py::array rng_array(const zrl::Xoshiro256pp::State& s) {
  return adopt(std::vector<uint64_t>(s.begin(), s.end()), py::dtype::of<uint64_t>(), {4});
}

// Reads a state dict back, checking names, dtypes and shapes; the arrays it
// borrows stay alive in `keep` while the GIL is released.
class StateReader {
 public:
  StateReader(const py::handle& obj, std::vector<std::string> expected) {
    if (!py::isinstance<py::dict>(obj))
      throw py::value_error("state: expected a dict of numpy arrays, got " + type_name(obj));
    d_ = py::reinterpret_borrow<py::dict>(obj);
    for (const auto& name : expected)
      if (!d_.contains(name)) throw py::value_error("state: missing '" + name + "'");
    for (const auto& kv : d_) {
      const std::string key = py::str(kv.first);
      if (std::find(expected.begin(), expected.end(), key) == expected.end())
        throw py::value_error("state: unexpected '" + key + "'");
    }
  }

  py::array array(const std::string& name, const py::dtype& dtype,
                  const std::vector<py::ssize_t>& shape) {
    py::object obj = d_[py::str(name)];
    if (!py::isinstance<py::array>(obj))
      throw py::value_error("state['" + name + "']: expected a numpy array, got " + type_name(obj));
    auto arr = py::reinterpret_borrow<py::array>(obj);
    if (!is_dtype(arr.dtype(), dtype))
      throw py::value_error("state['" + name + "']: expected dtype " + std::string(py::str(dtype)) +
                            ", got " + std::string(py::str(arr.dtype())));
    if (std::vector<py::ssize_t>(arr.shape(), arr.shape() + arr.ndim()) != shape)
      throw py::value_error("state['" + name + "']: expected shape " + shape_str(shape) + ", got " +
                            array_shape_str(arr));
    arr = py::array::ensure(arr, py::array::c_style);
    keep_.push_back(arr);
    return arr;
  }

  int64_t int64(const std::string& name) {
    return *static_cast<const int64_t*>(array(name, py::dtype::of<int64_t>(), {}).data());
  }
  double float64(const std::string& name) {
    return *static_cast<const double*>(array(name, py::dtype::of<double>(), {}).data());
  }
  std::size_t non_negative(const std::string& name) {
    const int64_t v = int64(name);
    if (v < 0) throw py::value_error("state['" + name + "']: must be >= 0");
    return static_cast<std::size_t>(v);
  }
  zrl::Xoshiro256pp::State rng_state() {
    const auto* p =
        static_cast<const uint64_t*>(array("rng_state", py::dtype::of<uint64_t>(), {4}).data());
    return {p[0], p[1], p[2], p[3]};
  }
  void check_format() {
    if (int64("format_version") != kStateFormat)
      throw py::value_error("state['format_version']: expected " + std::to_string(kStateFormat));
  }

  zrl::StorageStateView storage(const std::vector<zrl::FieldSpec>& fields, std::size_t capacity) {
    zrl::StorageStateView view;
    view.size = non_negative("size");
    if (view.size > capacity)  // before the arrays' shapes are checked against it
      throw py::value_error("state['size']: " + std::to_string(view.size) +
                            " exceeds the capacity " + std::to_string(capacity));
    view.cursor = non_negative("cursor");
    view.generations = static_cast<const int64_t*>(
        array("generations", py::dtype::of<int64_t>(), {py::ssize_t(view.size)}).data());
    for (const auto& f : fields)
      view.columns.push_back(
          array("field/" + f.name, numpy_dtype(f.dtype), leading(py::ssize_t(view.size), f))
              .data());
    return view;
  }

 private:
  py::dict d_;
  std::vector<py::array> keep_;
};

std::vector<std::string> storage_state_names(const std::vector<zrl::FieldSpec>& fields,
                                             std::vector<std::string> names) {
  for (const char* n : {"format_version", "capacity", "size", "cursor", "generations", "rng_state"})
    names.push_back(n);
  for (const auto& f : fields) names.push_back("field/" + f.name);
  return names;
}

py::list fields_list(const std::vector<zrl::FieldSpec>& fields) {
  py::list out;
  for (const auto& f : fields) {
    py::tuple shape(f.shape.size());
    for (std::size_t d = 0; d < f.shape.size(); ++d) shape[d] = f.shape[d];
    out.append(py::make_tuple(f.name, shape, zrl::dtype_name(f.dtype)));
  }
  return out;
}

using zrl::PrioritizedReplay;
using zrl::UniformReplay;
using release_gil = py::call_guard<py::gil_scoped_release>;

void bind_replay(py::module_& m) {
  py::class_<PrioritizedReplay>(m, "PrioritizedReplay",
                                "Prioritised replay over C++ column storage (see zrl.replay).")
      .def(
          py::init([](py::ssize_t capacity, const py::handle& fields, double alpha, uint64_t seed) {
            if (capacity <= 0) throw py::value_error("capacity: must be positive");
            auto specs = field_specs(fields);
            py::gil_scoped_release release;
            return std::make_unique<PrioritizedReplay>(std::size_t(capacity), std::move(specs),
                                                       alpha, seed);
          }),
          py::arg("capacity"), py::arg("fields"), py::arg("alpha"), py::arg("seed"))
      .def_property_readonly("capacity", &PrioritizedReplay::capacity)
      .def_property_readonly("alpha", &PrioritizedReplay::alpha)
      .def_property_readonly(
          "fields", [](const PrioritizedReplay& self) { return fields_list(self.fields()); })
      .def("__len__", &PrioritizedReplay::size, release_gil())
      .def_property_readonly("max_priority",
                             py::cpp_function(&PrioritizedReplay::max_priority, release_gil()))
      .def(
          "add",
          [](PrioritizedReplay& self, const py::handle& batch, const py::handle& priorities) {
            BatchColumns cols = batch_columns(batch, self.fields());
            py::array_t<double, py::array::c_style> p;
            if (!priorities.is_none()) p = as_float64_vector(priorities, "priorities", cols.rows);
            const double* pp = priorities.is_none() ? nullptr : p.data();
            py::gil_scoped_release release;
            self.add(cols.data.data(), cols.rows, pp);
          },
          py::arg("batch"), py::arg("priorities") = py::none())
      .def(
          "sample",
          [](PrioritizedReplay& self, py::ssize_t batch_size, double beta) {
            const std::size_t n = positive_batch_size(batch_size);
            py::array_t<int64_t> keys(n);
            py::array_t<float> weights(n);
            std::vector<void*> data;
            py::dict batch = new_batch(self.fields(), n, data);
            {
              py::gil_scoped_release release;
              self.sample(n, beta, keys.mutable_data(), weights.mutable_data(), data.data());
            }
            return py::make_tuple(std::move(keys), std::move(weights), std::move(batch));
          },
          py::arg("batch_size"), py::arg("beta"))
      .def(
          "update_priorities",
          [](PrioritizedReplay& self, const py::handle& keys_obj, const py::handle& priorities) {
            auto keys = as_keys(keys_obj);
            auto p = as_float64_vector(priorities, "priorities", std::size_t(keys.shape(0)));
            py::gil_scoped_release release;
            return self.update_priorities(keys.data(), p.data(), std::size_t(keys.shape(0)));
          },
          py::arg("keys"), py::arg("priorities"))
      .def("state_dict",
           [](const PrioritizedReplay& self) {
             zrl::PrioritizedReplayState st;
             {
               py::gil_scoped_release release;
               st = self.export_state();
             }
             py::dict d;
             d["format_version"] = scalar_array<int64_t>(kStateFormat);
             d["capacity"] = scalar_array<int64_t>(int64_t(st.capacity));
             d["alpha"] = scalar_array<double>(st.alpha);
             d["max_priority"] = scalar_array<double>(st.max_priority);
             d["rng_state"] = rng_array(st.rng_state);
             const py::ssize_t size = py::ssize_t(st.storage.size);
             d["scaled_priorities"] =
                 adopt(std::move(st.scaled_priorities), py::dtype::of<float>(), {size});
             put_storage_state(d, std::move(st.storage), self.fields());
             return d;
           })
      .def(
          "load_state_dict",
          [](PrioritizedReplay& self, const py::handle& state) {
            StateReader r(state, storage_state_names(self.fields(), {"alpha", "max_priority",
                                                                     "scaled_priorities"}));
            r.check_format();
            zrl::PrioritizedReplayStateView view;
            view.capacity = r.non_negative("capacity");
            view.alpha = r.float64("alpha");
            view.max_priority = r.float64("max_priority");
            view.rng_state = r.rng_state();
            view.storage = r.storage(self.fields(), self.capacity());
            view.scaled_priorities =
                static_cast<const float*>(r.array("scaled_priorities", py::dtype::of<float>(),
                                                  {py::ssize_t(view.storage.size)})
                                              .data());
            py::gil_scoped_release release;
            self.import_state(view);
          },
          py::arg("state"))
      .def("_tree_total", &PrioritizedReplay::tree_total, release_gil())
      .def("_tree_min", &PrioritizedReplay::tree_min, release_gil())
      .def("_scaled_priorities",
           [](const PrioritizedReplay& self) {
             std::vector<float> v;
             {
               py::gil_scoped_release release;
               v = self.scaled_priorities();
             }
             const py::ssize_t n = py::ssize_t(v.size());
             return adopt(std::move(v), py::dtype::of<float>(), {n});
           })
      .def("_check_invariants", [](const PrioritizedReplay& self) {
        std::string why;
        {
          py::gil_scoped_release release;
          if (self.check_invariants(&why)) why.clear();
        }
        return why;
      });

  py::class_<UniformReplay>(m, "UniformReplay",
                            "Uniform replay over C++ column storage (see zrl.replay).")
      .def(py::init([](py::ssize_t capacity, const py::handle& fields, uint64_t seed) {
             if (capacity <= 0) throw py::value_error("capacity: must be positive");
             auto specs = field_specs(fields);
             py::gil_scoped_release release;
             return std::make_unique<UniformReplay>(std::size_t(capacity), std::move(specs), seed);
           }),
           py::arg("capacity"), py::arg("fields"), py::arg("seed"))
      .def_property_readonly("capacity", &UniformReplay::capacity)
      .def_property_readonly("fields",
                             [](const UniformReplay& self) { return fields_list(self.fields()); })
      .def("__len__", &UniformReplay::size, release_gil())
      .def(
          "add",
          [](UniformReplay& self, const py::handle& batch) {
            BatchColumns cols = batch_columns(batch, self.fields());
            py::gil_scoped_release release;
            self.add(cols.data.data(), cols.rows);
          },
          py::arg("batch"))
      .def(
          "sample",
          [](UniformReplay& self, py::ssize_t batch_size) {
            const std::size_t n = positive_batch_size(batch_size);
            std::vector<void*> data;
            py::dict batch = new_batch(self.fields(), n, data);
            {
              py::gil_scoped_release release;
              self.sample(n, data.data());
            }
            return batch;
          },
          py::arg("batch_size"))
      .def("state_dict",
           [](const UniformReplay& self) {
             zrl::UniformReplayState st;
             {
               py::gil_scoped_release release;
               st = self.export_state();
             }
             py::dict d;
             d["format_version"] = scalar_array<int64_t>(kStateFormat);
             d["capacity"] = scalar_array<int64_t>(int64_t(st.capacity));
             d["rng_state"] = rng_array(st.rng_state);
             put_storage_state(d, std::move(st.storage), self.fields());
             return d;
           })
      .def(
          "load_state_dict",
          [](UniformReplay& self, const py::handle& state) {
            StateReader r(state, storage_state_names(self.fields(), {}));
            r.check_format();
            zrl::UniformReplayStateView view;
            view.capacity = r.non_negative("capacity");
            view.rng_state = r.rng_state();
            view.storage = r.storage(self.fields(), self.capacity());
            py::gil_scoped_release release;
            self.import_state(view);
          },
          py::arg("state"));
}

// A Py_buffer released on scope exit; zeroed, so releasing one never filled (a failed
// PyObject_GetBuffer, or one filled by hand with no owner) does nothing.
struct BufferView {
  Py_buffer v{};
  BufferView() = default;
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  ~BufferView() { PyBuffer_Release(&v); }
};

// The chunks' arrays joined along `axis` into `out`, each element checked by the rule as
// it is copied (zrl::copy_checked): the batch join of a learner whose gate left these
// rules to it. Returns the indices of the parts that broke the rule (all of them are
// copied regardless).
py::list join_checked(const py::list& parts, int axis, const py::handle& out_obj, const std::string& rule_name,
                      uint64_t bound) {
  zrl::CopyRule rule;
  if (rule_name == "none") rule = zrl::CopyRule::kNone;
  else if (rule_name == "finite") rule = zrl::CopyRule::kFinite;
  else if (rule_name == "bound") rule = zrl::CopyRule::kBound;
  else throw py::value_error("rule: expected 'none', 'finite' or 'bound', got '" + rule_name + "'");
  if (!py::isinstance<py::array>(out_obj)) throw py::value_error("out: expected a numpy array");
  auto out = py::reinterpret_borrow<py::array>(out_obj);
  if (!(out.flags() & py::array::c_style)) throw py::value_error("out: expected a C-contiguous array");
  if (!out.writeable()) throw py::value_error("out: array is read-only");
  const py::ssize_t ndim = out.ndim();
  if (axis < 0 || axis >= ndim)
    throw py::value_error("axis " + std::to_string(axis) + " outside out's " + std::to_string(ndim) + " dimensions");
  const auto itemsize = static_cast<uint32_t>(out.itemsize());
  if (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8)
    throw py::value_error("out: items of 1, 2, 4 or 8 bytes expected, got " + std::string(py::str(out.dtype())));
  if (out.dtype().byteorder() == '>')  // (the checks read native order; so does the wire)
    throw py::value_error("out: a big-endian dtype, " + std::string(py::str(out.dtype())));
  if (rule == zrl::CopyRule::kFinite && (out.dtype().kind() != 'f' || itemsize == 1))
    throw py::value_error("rule 'finite' needs a float16, float32 or float64 array, got " + std::string(py::str(out.dtype())));
  if (rule == zrl::CopyRule::kBound && out.dtype().kind() != 'i' && out.dtype().kind() != 'u' && out.dtype().kind() != 'b')
    throw py::value_error("rule 'bound' needs an integer or bool array, got " + std::string(py::str(out.dtype())));
  uint64_t outer = 1;
  for (py::ssize_t d = 0; d < axis; ++d) outer *= static_cast<uint64_t>(out.shape(d));
  uint64_t trailing = 1;  // elements per step of the axis
  for (py::ssize_t d = axis + 1; d < ndim; ++d) trailing *= static_cast<uint64_t>(out.shape(d));
  struct Part {
    const uint8_t* data;
    uint64_t count;  // elements per outer step
  };
  std::vector<Part> ps;
  ps.reserve(parts.size());
  py::ssize_t along = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    py::handle h = parts[i];
    const std::string name = "parts[" + std::to_string(i) + "]";
    if (!py::isinstance<py::array>(h)) throw py::value_error(name + ": expected a numpy array");
    auto a = py::reinterpret_borrow<py::array>(h);
    if (!is_dtype(a.dtype(), out.dtype()))
      throw py::value_error(name + ": dtype " + std::string(py::str(a.dtype())) + ", out's is " + std::string(py::str(out.dtype())));
    if (a.ndim() != ndim) throw py::value_error(name + ": " + std::to_string(a.ndim()) + " dimensions, out has " + std::to_string(ndim));
    for (py::ssize_t d = 0; d < ndim; ++d)
      if (d != axis && a.shape(d) != out.shape(d))
        throw py::value_error(name + ": dimension " + std::to_string(d) + " is " + std::to_string(a.shape(d)) + ", out's is " +
                              std::to_string(out.shape(d)));
    if (!(a.flags() & py::array::c_style)) throw py::value_error(name + ": expected a C-contiguous array");
    along += a.shape(axis);
    ps.push_back(Part{static_cast<const uint8_t*>(a.data()), static_cast<uint64_t>(a.shape(axis)) * trailing});
  }
  if (along != out.shape(axis))
    throw py::value_error("the parts hold " + std::to_string(along) + " along axis " + std::to_string(axis) + ", out " +
                          std::to_string(out.shape(axis)));
  auto* dst = static_cast<uint8_t*>(out.mutable_data());
  const uint64_t row = static_cast<uint64_t>(along) * trailing * itemsize;  // bytes of out per outer step
  std::vector<uint8_t> bad(ps.size(), 0);
  {
    py::gil_scoped_release release;
    uint64_t col = 0;  // bytes of a row of out before part i's
    for (std::size_t i = 0; i < ps.size(); ++i) {  // part by part: each is read front to back
      const uint64_t n = ps[i].count;
      for (uint64_t o = 0; o < outer; ++o)
        if (!zrl::copy_checked(dst + o * row + col, ps[i].data + o * n * itemsize, n, itemsize, rule, bound)) bad[i] = 1;
      col += n * itemsize;
    }
  }
  py::list result;
  for (std::size_t i = 0; i < bad.size(); ++i)
    if (bad[i]) result.append(i);
  return result;
}

// FrameGate.check runs once per received message: the frame is taken through the
// raw buffer protocol (no py::buffer_info vectors), and the result is None or a
// plain tuple.
py::object gate_check(const zrl::FrameGate& gate, py::handle frame) {
  BufferView view;
  if (PyObject_GetBuffer(frame.ptr(), &view.v, PyBUF_SIMPLE) != 0) throw py::error_already_set();
  // Python measures the frame with len(): in items. Vouch only where items are bytes.
  if (view.v.itemsize != 1) return py::none();
  zrl::GateResult r = gate.check(static_cast<const uint8_t*>(view.v.buf), static_cast<std::size_t>(view.v.len));
  if (r.layout < 0) return py::none();
  return py::make_tuple(r.layout, r.sender_id, r.seq, r.policy_version, r.meta_offset, r.meta_len);
}

void bind_gate(py::module_& m) {
  py::class_<zrl::FrameGate>(m, "FrameGate",
                             "Checks frames of one kind against descriptor blocks Python accepted "
                             "before (csrc/wire_gate.h); zrl.wire.Gate wraps it.")
      .def(py::init<uint16_t, uint64_t>(), py::arg("kind"), py::arg("max_bytes"))
      .def(
          "add",
          [](zrl::FrameGate& self, py::bytes block, uint64_t first, uint64_t end,
             const py::iterable& bounds, const py::iterable& marks, const py::iterable& finite) {
            std::vector<zrl::GateBound> bs;
            for (py::handle item : bounds) {
              auto t = item.cast<py::tuple>();
              if (t.size() != 4)
                throw py::value_error("bounds: expected (offset, count, itemsize, bound) tuples");
              bs.push_back(zrl::GateBound{t[0].cast<uint64_t>(), t[1].cast<uint64_t>(),
                                          t[2].cast<uint32_t>(), t[3].cast<uint64_t>()});
            }
            std::vector<zrl::GateMarks> ms;
            for (py::handle item : marks) {
              auto t = item.cast<py::tuple>();
              if (t.size() != 5)
                throw py::value_error(
                    "marks: expected (index_offset, index_count, marked_offset, excluded_offset, flags_count) tuples");
              ms.push_back(zrl::GateMarks{t[0].cast<uint64_t>(), t[1].cast<uint64_t>(), t[2].cast<uint64_t>(),
                                          t[3].cast<uint64_t>(), t[4].cast<uint64_t>()});
            }
            std::vector<zrl::GateFinite> fs;
            for (py::handle item : finite) {
              auto t = item.cast<py::tuple>();
              if (t.size() != 3) throw py::value_error("finite: expected (offset, count, itemsize) tuples");
              fs.push_back(zrl::GateFinite{t[0].cast<uint64_t>(), t[1].cast<uint64_t>(), t[2].cast<uint32_t>()});
            }
            return self.add(std::string(block), first, end, bs, ms, fs);
          },
          py::arg("block"), py::arg("first"), py::arg("end"), py::arg("bounds"), py::arg("marks") = py::tuple(),
          py::arg("finite") = py::tuple(),
          "Registers a descriptor block with the arrays' byte span, the bounds "
          "[(offset, count, itemsize, bound)], the marks rules [(index_offset, index_count, "
          "marked_offset, excluded_offset, flags_count)] and the finite rules [(offset, count, "
          "itemsize)] (floats: no NaN or infinity); returns its id (a full gate reuses its "
          "slots in turn).")
      .def("clear", &zrl::FrameGate::clear)
      .def("__len__", &zrl::FrameGate::size)
      .def("check", &gate_check, py::arg("frame"),
           "None, or (layout, sender_id, seq, policy_version, meta_offset, meta_len) for a frame "
           "the gate vouches for.");
}


// A received message too large to copy: Python reads it through the buffer
// protocol (a read-only memoryview) and libzmq frees it when the last view goes.
// A plain CPython type rather than a pybind11 class: creating one and filling its
// buffer costs ~0.1 us where pybind11's instance and buffer_info cost ~0.5 us, on
// every message the learner receives.
struct ZmqFrameObject {
  PyObject_HEAD
  const zrl::ZmqApi* api;
  zrl::ZmqMsg msg;
};

void zmq_frame_dealloc(PyObject* self) {
  auto* f = reinterpret_cast<ZmqFrameObject*>(self);
  f->api->msg_close(&f->msg);
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free(self);
  Py_DECREF(type);  // a heap type: each instance holds a reference to it
}

int zmq_frame_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  auto* f = reinterpret_cast<ZmqFrameObject*>(self);
  return PyBuffer_FillInfo(view, self, f->api->msg_data(&f->msg), static_cast<Py_ssize_t>(f->api->msg_size(&f->msg)),
                           /*readonly=*/1, flags);
}

PyType_Slot kZmqFrameSlots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(zmq_frame_dealloc)},
    {Py_bf_getbuffer, reinterpret_cast<void*>(zmq_frame_getbuffer)},
    {Py_tp_doc, const_cast<char*>("A received message, freed with its last view.")},
    {0, nullptr}};

// Only drain makes them (Python cannot: an instance without a message would crash).
PyType_Spec kZmqFrameSpec = {"zrl._core.ZmqFrame", sizeof(ZmqFrameObject), 0,
                             Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, kZmqFrameSlots};

PyTypeObject* zmq_frame_type = nullptr;  // made in bind_native

// The fields of a received message (wire.Message is a Python subclass that adds its
// methods): a C type so that ZmqNative.drain can make the learner's messages without
// running Python for each one.
struct MessageObject {
  PyObject_HEAD
  PyObject* kind;
  PyObject* sender_id;
  PyObject* seq;
  PyObject* policy_version;
  PyObject* meta;
  PyObject* infos;
  PyObject* buf;
  PyObject* arrays;  // NULL (None) until wire.Message.arrays makes the views
  PyObject* nbytes;
};

#define ZRL_MESSAGE_FIELDS(X) X(kind) X(sender_id) X(seq) X(policy_version) X(meta) X(infos) X(buf) X(arrays) X(nbytes)

int message_traverse(PyObject* self, visitproc visit, void* arg) {
  auto* m = reinterpret_cast<MessageObject*>(self);
#define ZRL_VISIT(f) Py_VISIT(m->f);
  ZRL_MESSAGE_FIELDS(ZRL_VISIT)
#undef ZRL_VISIT
  Py_VISIT(Py_TYPE(self));  // (a heap type's instances own a reference to it)
  return 0;
}

int message_clear(PyObject* self) {
  auto* m = reinterpret_cast<MessageObject*>(self);
#define ZRL_CLEAR(f) Py_CLEAR(m->f);
  ZRL_MESSAGE_FIELDS(ZRL_CLEAR)
#undef ZRL_CLEAR
  return 0;
}

void message_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  message_clear(self);
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free(self);
  Py_DECREF(type);
}

PyMemberDef kMessageMembers[] = {
    {"kind", T_OBJECT_EX, offsetof(MessageObject, kind), 0, nullptr},
    {"sender_id", T_OBJECT_EX, offsetof(MessageObject, sender_id), 0, nullptr},
    {"seq", T_OBJECT_EX, offsetof(MessageObject, seq), 0, nullptr},
    {"policy_version", T_OBJECT_EX, offsetof(MessageObject, policy_version), 0, nullptr},
    {"meta", T_OBJECT_EX, offsetof(MessageObject, meta), 0, nullptr},
    {"infos", T_OBJECT_EX, offsetof(MessageObject, infos), 0, nullptr},
    {"_buf", T_OBJECT_EX, offsetof(MessageObject, buf), 0, nullptr},
    {"_arrays", T_OBJECT, offsetof(MessageObject, arrays), 0, nullptr},
    {"nbytes", T_OBJECT_EX, offsetof(MessageObject, nbytes), 0, nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot kMessageSlots[] = {
    {Py_tp_new, reinterpret_cast<void*>(PyType_GenericNew)},
    {Py_tp_dealloc, reinterpret_cast<void*>(message_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(message_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(message_clear)},
    {Py_tp_members, kMessageMembers},
    {Py_tp_doc, const_cast<char*>("The fields of a received message: the base of wire.Message.")},
    {0, nullptr}};

PyType_Spec kMessageSpec = {"zrl._core.MessageBase", sizeof(MessageObject), 0,
                            Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, kMessageSlots};

PyTypeObject* message_base_type = nullptr;  // made in bind_native

// A frame buffer that libzmq sends without a copy (zrl::SendBlock): wire.OutMessage
// keeps a large frame in one, and send_frame sends it zero-copy. Writable through
// the buffer protocol; in_flight counts the messages libzmq still holds.
struct SendBufferObject {
  PyObject_HEAD
  zrl::SendBlock* block;
};

PyTypeObject* send_buffer_type = nullptr;  // made in bind_native

PyObject* send_buffer_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  static const char* kwlist[] = {"nbytes", nullptr};
  Py_ssize_t n = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "n:SendBuffer", const_cast<char**>(kwlist), &n)) return nullptr;
  if (n < 0) {
    PyErr_Format(PyExc_ValueError, "SendBuffer: nbytes must be >= 0, got %zd", n);
    return nullptr;
  }
  zrl::SendBlock* block = zrl::new_send_block(static_cast<std::size_t>(n));
  if (!block) return PyErr_NoMemory();
  auto* self = reinterpret_cast<SendBufferObject*>(type->tp_alloc(type, 0));
  if (!self) {
    zrl::release_send_block(block);
    return nullptr;
  }
  self->block = block;
  return reinterpret_cast<PyObject*>(self);
}

void send_buffer_dealloc(PyObject* self) {
  // The bytes stay while libzmq still sends them: the last message frees them.
  zrl::release_send_block(reinterpret_cast<SendBufferObject*>(self)->block);
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free(self);
  Py_DECREF(type);
}

int send_buffer_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  zrl::SendBlock* b = reinterpret_cast<SendBufferObject*>(self)->block;
  return PyBuffer_FillInfo(view, self, b->data, static_cast<Py_ssize_t>(b->size), /*readonly=*/0, flags);
}

PyObject* send_buffer_in_flight(PyObject* self, void*) {
  return PyLong_FromLong(zrl::in_flight(*reinterpret_cast<SendBufferObject*>(self)->block));
}

PyGetSetDef kSendBufferGetSet[] = {
    {"in_flight", send_buffer_in_flight, nullptr,
     const_cast<char*>("Messages libzmq still holds: write nothing into the buffer while this is above 0."), nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyType_Slot kSendBufferSlots[] = {
    {Py_tp_new, reinterpret_cast<void*>(send_buffer_new)},
    {Py_tp_dealloc, reinterpret_cast<void*>(send_buffer_dealloc)},
    {Py_bf_getbuffer, reinterpret_cast<void*>(send_buffer_getbuffer)},
    {Py_tp_getset, kSendBufferGetSet},
    {Py_tp_doc, const_cast<char*>("SendBuffer(nbytes): zeroed bytes that ZeroMQ sends without a copy "
                                  "(send_frame); the memory lives until the owner and every message are gone.")},
    {0, nullptr}};

#ifndef Py_TPFLAGS_IMMUTABLETYPE  // (before Python 3.10)
#define Py_TPFLAGS_IMMUTABLETYPE 0
#endif
PyType_Spec kSendBufferSpec = {"zrl._core.SendBuffer", sizeof(SendBufferObject), 0,
                               Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, kSendBufferSlots};

// The METH_FASTCALL functions' integer arguments args[at[k]] into out[k], as
// struct.pack_into takes them (anything with __index__, numpy's too), each checked
// before the next runs: false with the Python error set.
template <typename T, std::size_t N>
bool index_args(PyObject* const* args, const int (&at)[N], T (&out)[N]) {
  static_assert(std::is_same_v<T, long long> || std::is_same_v<T, unsigned long long>);
  for (std::size_t k = 0; k < N; ++k) {
    PyObject* i = PyNumber_Index(args[at[k]]);
    if (!i) return false;
    if constexpr (std::is_same_v<T, long long>) {
      out[k] = PyLong_AsLongLong(i);
    } else {
      out[k] = PyLong_AsUnsignedLongLong(i);
    }
    Py_DECREF(i);
    if (out[k] == static_cast<T>(-1) && PyErr_Occurred()) return false;
  }
  return true;
}

// send_frame(socket, frame, total, seq, policy_version, wait[, to, from, n]) -> 0 or
// zmq errno: an actor sends each chunk through this, so it is a METH_FASTCALL function
// rather than a pybind11 method (whose argument conversion costs more than the send).
// It stamps seq / policy_version / total into the frame's header and sends
// frame[:total] on the libzmq socket at `socket` (pyzmq's Socket.underlying), first
// without waiting; if the queue is full and `wait`, again with the GIL released. With
// (to, from, n), once a copied frame has gone (0 returned), it copies frame[from:from+n]
// to frame[to:to+n]: the next chunk's bootstrap row, in the same call.
PyObject* native_send_frame(PyObject* capsule, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6 && nargs != 9) {
    PyErr_SetString(PyExc_TypeError, "send_frame(socket, frame, total, seq, policy_version, wait[, to, from, n])");
    return nullptr;
  }
  auto* api = static_cast<const zrl::ZmqApi*>(PyCapsule_GetPointer(capsule, "zrl.ZmqApi"));
  if (!api) return nullptr;
  unsigned long long v[4];  // socket, total, seq, policy_version
  if (!index_args(args, {0, 2, 3, 4}, v)) return nullptr;
  const int wait = PyObject_IsTrue(args[5]);
  if (wait < 0) return nullptr;
  void* sock = reinterpret_cast<void*>(static_cast<uintptr_t>(v[0]));
  const unsigned long long total = v[1], seq = v[2], version = v[3];
  if (!sock) {
    PyErr_SetString(PyExc_ValueError, "send_frame: null socket");
    return nullptr;
  }
  // The frame: a SendBuffer goes out without a copy (libzmq holds the block until it has
  // sent it); any other writable buffer of bytes is copied by zmq_send.
  zrl::SendBlock* block = nullptr;
  BufferView view;  // (for a SendBuffer, filled here with no owner: nothing to release)
  if (Py_TYPE(args[1]) == send_buffer_type) {
    block = reinterpret_cast<SendBufferObject*>(args[1])->block;
    if (zrl::in_flight(*block) != 0) {  // stamping it would change a message libzmq is sending
      PyErr_SetString(PyExc_ValueError, "send_frame: the SendBuffer is still in flight");
      return nullptr;
    }
    view.v.buf = block->data;
    view.v.len = static_cast<Py_ssize_t>(block->size);
    view.v.itemsize = 1;
  } else if (PyObject_GetBuffer(args[1], &view.v, PyBUF_WRITABLE) != 0) {
    return nullptr;
  }
  auto* data = static_cast<uint8_t*>(view.v.buf);
  unsigned long long row[3] = {0, 0, 0};  // to, from, n
  if (nargs == 9) {
    if (block) {  // (libzmq may still be reading it: nothing may write into it now)
      PyErr_SetString(PyExc_ValueError, "send_frame: a row copy needs a frame that goes out copied, not a SendBuffer");
      return nullptr;
    }
    if (!index_args(args, {6, 7, 8}, row)) return nullptr;
    const auto len = static_cast<unsigned long long>(view.v.len);
    if (row[2] > len || row[0] > len - row[2] || row[1] > len - row[2]) {
      PyErr_Format(PyExc_ValueError, "send_frame: row copy [%llu, +%llu) <- [%llu, +%llu) outside a %zd-byte frame",
                   row[0], row[2], row[1], row[2], view.v.len);
      return nullptr;
    }
  }
  if (view.v.itemsize != 1 || !zrl::stamp_header(data, static_cast<std::size_t>(view.v.len), seq, version, total)) {
    PyErr_Format(PyExc_ValueError, "send_frame: total %llu outside a %zd-byte frame of bytes", total, view.v.len);
    return nullptr;
  }
  auto send = [&](int flags) {
    return block ? zrl::send_zero_copy(*api, sock, block, total, flags) : zrl::send(*api, sock, data, total, flags);
  };
  int err = send(zrl::kZmqDontWait);
  if (err == EAGAIN && wait) {
    Py_BEGIN_ALLOW_THREADS
    err = send(0);
    Py_END_ALLOW_THREADS
  }
  if (err == 0 && row[2] != 0) std::memmove(data + row[0], data + row[1], row[2]);  // (zmq_send copied the frame)
  return PyLong_FromLong(err);
}

PyMethodDef kSendFrameDef = {
    "send_frame", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(native_send_frame)), METH_FASTCALL,
    "send_frame(socket, frame, total, seq, policy_version, wait[, to, from, n]) -> 0 or the zmq errno (EAGAIN: "
    "the queue is full and wait is false). Stamps seq, policy_version and total into the frame's header and sends "
    "frame[:total] on the libzmq socket at address `socket` (pyzmq's Socket.underlying): a SendBuffer "
    "without a copy (libzmq holds it until sent: see SendBuffer.in_flight), anything else copied. With "
    "(to, from, n), a frame that went out copied then gets frame[to:to+n] = frame[from:from+n]."};

// (items, unvouched) for up to `max` messages, the first waited for up to wait_ms
// (zrl::drain). An item is (message, bindings) for a frame the FrameGate vouched for:
// a `message_type` (a subclass of MessageBase) of kind `kind`, its infos and bindings
// from layouts[layout] = (infos, bindings, block); anything else is its payload, for
// Python's checks, and `unvouched` counts those. A payload is bytes below copy_below,
// else a read-only memoryview that keeps the message.
py::tuple drain_items(const zrl::ZmqApi* api, void* socket, const zrl::FrameGate& gate, std::size_t max,
                    std::size_t copy_below, int wait_ms, const py::list& layouts, PyTypeObject* mtype,
                    const py::handle& kind) {
  // A burst of its own per call (one ZmqNative serves every gate and thread in the
  // process), its storage kept per thread: room for 64 messages is a 7 KB allocation,
  // a tenth of a small message's receive. Taken out of the cache for the call, so a
  // nested call (a finalizer run by the allocations below) makes its own.
  thread_local std::vector<zrl::Drained> cache;
  std::vector<zrl::Drained> burst = std::move(cache);
  struct GiveBack {
    std::vector<zrl::Drained>& burst;
    ~GiveBack() {
      burst.clear();  // (every message is closed by then: CloseAll below runs first)
      if (burst.capacity() > cache.capacity()) cache = std::move(burst);
    }
  } give_back{burst};
  int err;
  {
    py::gil_scoped_release release;
    err = zrl::drain(*api, socket, gate, max, &burst, wait_ms);
  }
  const std::size_t n = burst.size();
  // Every message of the burst is closed on the way out, whatever happens below;
  // a large one has been moved into its ZmqFrame by then (closing the empty rest is a no-op).
  struct CloseAll {
    const zrl::ZmqApi* api;
    std::vector<zrl::Drained>& burst;
    ~CloseAll() {
      for (auto& d : burst) api->msg_close(&d.msg);
    }
  } close_all{api, burst};
  if (n == 0 && err != 0) {
    PyErr_SetObject(PyExc_OSError, py::make_tuple(err, api->strerror(err)).ptr());
    throw py::error_already_set();
  }
  const std::size_t n_layouts = layouts.size();
  std::size_t unvouched = 0;
  py::list out(n);
  for (std::size_t i = 0; i < n; ++i) {
    zrl::ZmqMsg* msg = &burst[i].msg;
    const std::size_t size = api->msg_size(msg);
    py::object payload;
    if (size < copy_below) {
      payload = py::bytes(static_cast<const char*>(api->msg_data(msg)), size);
    } else {  // no copy: Python gets a view, and the message lives as long as the view
      auto* frame = PyObject_New(ZmqFrameObject, zmq_frame_type);
      if (!frame) throw py::error_already_set();
      frame->api = api;
      api->msg_init(&frame->msg);
      api->msg_move(&frame->msg, msg);
      py::object owner = py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(frame));
      payload = py::reinterpret_steal<py::object>(PyMemoryView_FromObject(owner.ptr()));
      if (!payload) throw py::error_already_set();
    }
    const zrl::GateResult& g = burst[i].gate;
    py::object item;
    if (g.layout >= 0 && static_cast<std::size_t>(g.layout) < n_layouts) {
      py::tuple entry = layouts[static_cast<std::size_t>(g.layout)];  // (infos, bindings, block)
      py::object meta = g.meta_len ? payload[py::slice(static_cast<py::ssize_t>(g.meta_offset),
                                                       static_cast<py::ssize_t>(g.meta_offset + g.meta_len), 1)]
                                   : py::bytes();
      py::object m = py::reinterpret_steal<py::object>(mtype->tp_alloc(mtype, 0));
      if (!m) throw py::error_already_set();
      auto* f = reinterpret_cast<MessageObject*>(m.ptr());
      f->kind = kind.inc_ref().ptr();
      f->sender_id = py::int_(g.sender_id).release().ptr();
      f->seq = py::int_(g.seq).release().ptr();
      f->policy_version = py::int_(g.policy_version).release().ptr();
      f->meta = meta.release().ptr();
      f->infos = py::object(entry[0]).release().ptr();
      f->buf = payload.release().ptr();
      f->nbytes = py::int_(size).release().ptr();
      item = py::make_tuple(std::move(m), entry[1]);
    } else {
      item = std::move(payload);
      ++unvouched;
    }
    PyList_SET_ITEM(out.ptr(), static_cast<py::ssize_t>(i), item.release().ptr());
  }
  return py::make_tuple(std::move(out), unvouched);
}

// drain(socket, gate, max, copy_below, wait_ms, layouts, message_type, kind) ->
// (items, unvouched): the learner's receiver calls this for every burst, so it is a
// METH_FASTCALL function (pybind11's argument conversion of eight arguments costs
// ~0.3 us, as much as a small message's receive).
PyObject* native_drain(PyObject* capsule, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 8) {
    PyErr_SetString(PyExc_TypeError, "drain(socket, gate, max, copy_below, wait_ms, layouts, message_type, kind)");
    return nullptr;
  }
  auto* api = static_cast<const zrl::ZmqApi*>(PyCapsule_GetPointer(capsule, "zrl.ZmqApi"));
  if (!api) return nullptr;
  long long v[4];  // socket, max, copy_below, wait_ms
  if (!index_args(args, {0, 2, 3, 4}, v)) return nullptr;
  if (v[0] == 0 || v[1] < 0 || v[2] < 0 || v[3] < -1 || v[3] > INT32_MAX) {
    PyErr_Format(PyExc_ValueError, "drain: socket %lld, max %lld, copy_below %lld, wait_ms %lld out of range", v[0],
                 v[1], v[2], v[3]);
    return nullptr;
  }
  if (!PyList_Check(args[5])) {
    PyErr_SetString(PyExc_TypeError, "drain: layouts must be a list");
    return nullptr;
  }
  if (!PyType_Check(args[6]) || !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(args[6]), message_base_type)) {
    PyErr_SetString(PyExc_TypeError, "drain: message_type must be a subclass of zrl._core.MessageBase");
    return nullptr;
  }
  try {
    const auto& gate = py::cast<const zrl::FrameGate&>(py::handle(args[1]));
    return drain_items(api, reinterpret_cast<void*>(static_cast<uintptr_t>(v[0])), gate, static_cast<std::size_t>(v[1]),
                       static_cast<std::size_t>(v[2]), static_cast<int>(v[3]),
                       py::reinterpret_borrow<py::list>(args[5]), reinterpret_cast<PyTypeObject*>(args[6]),
                       py::handle(args[7]))
        .release()
        .ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::cast_error&) {
    PyErr_SetString(PyExc_TypeError, "drain: gate must be a zrl._core.FrameGate");
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

PyMethodDef kDrainDef = {
    "drain", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(native_drain)), METH_FASTCALL,
    "drain(socket, gate, max, copy_below, wait_ms, layouts, message_type, kind) -> (items, unvouched). Up to "
    "`max` messages from the libzmq socket at address `socket` (pyzmq's Socket.underlying), each checked by "
    "the FrameGate `gate`, the first waited for up to `wait_ms` (0: not at all, -1: for ever; a blocking "
    "receive without the GIL), the rest not at all. An item is (message_type instance of kind `kind`, "
    "bindings) where the gate vouched for the frame with layouts[layout] = (infos, bindings, block), else the "
    "frame's payload (bytes, or a read-only memoryview from copy_below bytes up); unvouched counts those. An "
    "OSError(errno) for a failed receive with nothing received. Any thread, but one per socket (and per "
    "gate), as ZeroMQ requires."};

// pyzmq's libzmq reached from C++ (csrc/zmq_native.h); zrl.transport.native() builds one.
class ZmqNative {
 public:
  ZmqNative(const std::string& module, int major, int minor, int patch) {
    std::string why;
    api_ = zrl::ZmqApi::attach(module, major, minor, patch, &why);
    if (!api_) throw std::runtime_error(why);
  }
  const std::string& library() const { return api_->library; }

  // send_frame(socket, frame, total, seq, policy_version, wait) as a plain CPython
  // function bound to this library (see native_send_frame).
  py::object send_frame_function() const {
    py::capsule api(const_cast<zrl::ZmqApi*>(api_), "zrl.ZmqApi");
    PyObject* f = PyCFunction_New(&kSendFrameDef, api.ptr());
    if (!f) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(f);
  }

  // drain(socket, gate, max, copy_below, wait_ms, layouts, message_type, kind) as a
  // plain CPython function bound to this library (see native_drain).
  py::object drain_function() const {
    py::capsule api(const_cast<zrl::ZmqApi*>(api_), "zrl.ZmqApi");
    PyObject* f = PyCFunction_New(&kDrainDef, api.ptr());
    if (!f) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(f);
  }

 private:
  const zrl::ZmqApi* api_ = nullptr;
};

void bind_native(py::module_& m) {
  send_buffer_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&kSendBufferSpec));
  if (!send_buffer_type) throw py::error_already_set();
  m.attr("SendBuffer") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(send_buffer_type));
  message_base_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&kMessageSpec));
  if (!message_base_type) throw py::error_already_set();
  m.attr("MessageBase") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(message_base_type));
  zmq_frame_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&kZmqFrameSpec));
  if (!zmq_frame_type) throw py::error_already_set();
  m.attr("ZmqFrame") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(zmq_frame_type));
  py::class_<ZmqNative>(m, "ZmqNative",
                        "pyzmq's own libzmq, reached from C++ for the per-message send and receive loops "
                        "(csrc/zmq_native.h). RuntimeError, with the reason, where it cannot be found.")
      .def(py::init<const std::string&, int, int, int>(), py::arg("module"), py::arg("major"), py::arg("minor"),
           py::arg("patch"))
      .def_property_readonly("library", &ZmqNative::library)
      .def_property_readonly("send_frame", &ZmqNative::send_frame_function,
                             "send_frame(socket, frame, total, seq, policy_version, wait[, to, from, n]) -> 0 or "
                             "the zmq errno (EAGAIN: the queue is full and wait is false): stamps seq, "
                             "policy_version and total into the frame's header and sends frame[:total] on the "
                             "libzmq socket at address `socket` (pyzmq's Socket.underlying): a SendBuffer without "
                             "a copy, anything else copied (then, with to/from/n, one row copy within the frame).")
      .def_property_readonly("drain", &ZmqNative::drain_function,
                             "drain(socket, gate, max, copy_below, wait_ms, layouts, message_type, kind) -> "
                             "(items, unvouched): a burst of checked messages (see its own doc); each access "
                             "makes the function anew, so keep it.");
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "zrl's C++ kernels (see zrl.learner.vtrace and zrl.replay for the Python faces)";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const std::out_of_range& e) {
      PyErr_SetString(PyExc_IndexError, e.what());
    }
  });

  m.def("vtrace", &vtrace, py::arg("log_rhos"), py::arg("discounts"), py::arg("rewards"),
        py::arg("values"), py::arg("bootstrap_value"), py::arg("clip_rho_threshold"),
        py::arg("clip_pg_rho_threshold"), py::arg("clip_c_threshold"), py::arg("lambda_"),
        "V-trace over time-major [T, B] float32 arrays; returns (vs, pg_advantages).\n"
        "Thresholds are > 0 (use inf for no clipping). Releases the GIL.");

  m.def("join_checked", &join_checked, py::arg("parts"), py::arg("axis"), py::arg("out"), py::arg("rule"),
        py::arg("bound") = 0,
        "Joins numpy arrays (C-contiguous, out's dtype, out's shape but along axis) into out along axis, "
        "checking each element as it is copied: rule 'none', 'finite' (no NaN or infinity; float16/32/64) or "
        "'bound' (each element, read as unsigned, < bound). Returns the indices of the parts that broke it; "
        "every part is copied regardless. out must not overlap a part. Releases the GIL while copying.");

  m.def("pixels_to_channels_last", &pixels_to_channels_last, py::arg("src"), py::arg("out"),
        "uint8 [N, C, H, W] -> out [N, H, W, C] (PyTorch's channels_last), cast to out's dtype: float32, "
        "uint8 (the relayout alone), or int16/uint16 receiving bfloat16 bits. Both C-contiguous and not overlapping. Releases the GIL.");

  m.def("quantize_rows", &quantize_rows, py::arg("src"), py::arg("out"), py::arg("scales"),
        "Weights src [R, K] float32 (or int16/uint16 holding bfloat16 bits) -> out int8 [R, K] "
        "and scales float32 [R], per row: scale = max(max|row| / 127, 1e-12), "
        "out = clamp(round-half-even(src / scale), -127, 127). Returns False if a weight is not finite. Releases the GIL.");

  m.def("int8_layer", &int8_layer, py::arg("x"), py::arg("base"), py::arg("w"), py::arg("offs"), py::arg("scale"),
        py::arg("bias"), py::arg("inv_out_scale"), py::arg("qmax"), py::arg("out"), py::arg("kernel") = "auto",
        "One int8 layer of an actor's policy (a convolution without padding, or an FC): for p < P and oc < OC, "
        "acc = sum over j, q < 4 of x[base[p] + offs[j] + q] * w[j, oc, q] (uint8 x int8), y = acc * scale[oc] + bias[oc]; "
        "out uint8: clamp(round-half-even(y * inv_out_scale), 0, qmax); out float32: max(y, 0). AVX-512 VNNI or AVX2 where the "
        "CPU has it (int8_layer_kernels; AVX2 sums pairs of products in saturating int16: keep |w| <= 63 for x up to 255); "
        "kernel names one for tests. "
        "Releases the GIL.");
  m.def("int8_layer_kernels", &int8_layer_kernels,
        "The kernels int8_layer runs on this CPU, fastest first (the first is the one it picks): 'avx512_vnni' (exact "
        "for any int8 weights), 'avx2' (pairs of products in saturating int16), 'portable'.");

  m.def("sample_categorical", &sample_categorical, py::arg("logits"), py::arg("u"),
        "Draws one action per row of logits [B, n] float32 (softmax probabilities, inverse CDF at the "
        "uniforms u [B] float64 in [0, 1)); returns (actions int64 [B], log-probabilities float32 [B]). "
        "ValueError on a row with a NaN or +inf logit or every logit -inf. Releases the GIL.");

  bind_replay(m);
  bind_gate(m);
  bind_native(m);
}
