// zrl._core.vtrace (csrc/kernels/vtrace.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <utility>

#include "kernels/vtrace.h"
#include "python/bindings.h"
#include "python/numpy_args.h"

namespace py = pybind11;

namespace zrl::python {
namespace {

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

}  // namespace

void bind_vtrace(py::module_& m) {
  m.def("vtrace", &vtrace, py::arg("log_rhos"), py::arg("discounts"), py::arg("rewards"),
        py::arg("values"), py::arg("bootstrap_value"), py::arg("clip_rho_threshold"),
        py::arg("clip_pg_rho_threshold"), py::arg("clip_c_threshold"), py::arg("lambda_"),
        "V-trace over time-major [T, B] float32 arrays; returns (vs, pg_advantages).\n"
        "Thresholds are > 0 (use inf for no clipping). Releases the GIL.");
}

}  // namespace zrl::python
