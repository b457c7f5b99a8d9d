// zrl._core.sample_categorical (csrc/kernels/sample.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "kernels/sample.h"
#include "python/bindings.h"
#include "python/numpy_args.h"

namespace py = pybind11;

namespace zrl::python {
namespace {

// Categorical draws from logits [B, n] float32 with uniforms u [B] float64: (actions int64 [B],
// log-probabilities float32 [B]). See csrc/kernels/sample.h.
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
  const std::size_t outside = zrl::first_draw_outside_unit(u.data(), static_cast<std::size_t>(b));
  if (outside != static_cast<std::size_t>(b))
    throw py::value_error("u: draws must be in [0, 1), got " + std::to_string(u.data()[outside]));
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

}  // namespace

void bind_sampling(py::module_& m) {
  m.def("sample_categorical", &sample_categorical, py::arg("logits"), py::arg("u"),
        "Draws one action per row of logits [B, n] float32 (softmax probabilities, inverse CDF at the "
        "uniforms u [B] float64 in [0, 1)); returns (actions int64 [B], log-probabilities float32 [B]). "
        "ValueError on a row with a NaN or +inf logit or every logit -inf. Releases the GIL.");
}

}  // namespace zrl::python
