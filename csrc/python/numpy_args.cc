#include "python/numpy_args.h"

#include <string>

namespace py = pybind11;

namespace zrl::python {

bool is_dtype(const py::dtype& got, const py::dtype& want) {
  const char order = got.byteorder();
  return got.kind() == want.kind() && got.itemsize() == want.itemsize() &&
         (order == '=' || order == '|' || order == want.byteorder());
}

bool is_bf16_bits(const py::dtype& dt) {
  const char order = dt.byteorder();
  return (dt.kind() == 'i' || dt.kind() == 'u') && dt.itemsize() == 2 && (order == '=' || order == '|' || order == '<');
}

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

void require_aligned(const py::array& arr, const char* name) {
  if (!(arr.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_))
    throw py::value_error(std::string(name) + ": array is not aligned");
}

}  // namespace zrl::python
