// zrl._core.quantize_rows (csrc/kernels/quantize.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "kernels/quantize.h"
#include "python/bindings.h"
#include "python/numpy_args.h"

namespace py = pybind11;

namespace zrl::python {
namespace {

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

}  // namespace

void bind_quantize(py::module_& m) {
  m.def("quantize_rows", &quantize_rows, py::arg("src"), py::arg("out"), py::arg("scales"),
        "Weights src [R, K] float32 (or int16/uint16 holding bfloat16 bits) -> out int8 [R, K] "
        "and scales float32 [R], per row: scale = max(max|row| / 127, 1e-12), "
        "out = clamp(round-half-even(src / scale), -127, 127). Returns False if a weight is not finite. Releases the GIL.");
}

}  // namespace zrl::python
