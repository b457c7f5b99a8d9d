// zrl._core.pixels_to_channels_last (csrc/kernels/pixels.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "kernels/pixels.h"
#include "python/bindings.h"
#include "python/numpy_args.h"

namespace py = pybind11;

namespace zrl::python {
namespace {

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

}  // namespace

void bind_pixels(py::module_& m) {
  m.def("pixels_to_channels_last", &pixels_to_channels_last, py::arg("src"), py::arg("out"),
        "uint8 [N, C, H, W] -> out [N, H, W, C] (PyTorch's channels_last), cast to out's dtype: float32, "
        "uint8 (the relayout alone), or int16/uint16 receiving bfloat16 bits. Both C-contiguous and not overlapping. Releases the GIL.");
}

}  // namespace zrl::python
