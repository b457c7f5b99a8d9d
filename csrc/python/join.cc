// zrl._core.join_checked (csrc/wire/checked_join.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "python/bindings.h"
#include "python/numpy_args.h"
#include "wire/checked_join.h"

namespace py = pybind11;

namespace zrl::python {
namespace {

// The chunks' arrays joined along `axis` into `out`, each element checked by the rule as
// it is copied (zrl::join_checked): the batch join of a learner whose gate left these
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
  std::vector<zrl::JoinPart> ps;
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
    ps.push_back(zrl::JoinPart{static_cast<const uint8_t*>(a.data()), static_cast<uint64_t>(a.shape(axis)) * trailing});
  }
  if (along != out.shape(axis))
    throw py::value_error("the parts hold " + std::to_string(along) + " along axis " + std::to_string(axis) + ", out " +
                          std::to_string(out.shape(axis)));
  auto* dst = static_cast<uint8_t*>(out.mutable_data());
  std::vector<std::size_t> broken;
  {
    py::gil_scoped_release release;
    broken = zrl::join_checked(dst, ps, outer, itemsize, rule, bound);
  }
  py::list result;
  for (std::size_t i : broken) result.append(i);
  return result;
}

}  // namespace

void bind_join(py::module_& m) {
  m.def("join_checked", &join_checked, py::arg("parts"), py::arg("axis"), py::arg("out"), py::arg("rule"),
        py::arg("bound") = 0,
        "Joins numpy arrays (C-contiguous, out's dtype, out's shape but along axis) into out along axis, "
        "checking each element as it is copied: rule 'none', 'finite' (no NaN or infinity; float16/32/64) or "
        "'bound' (each element, read as unsigned, < bound). Returns the indices of the parts that broke it; "
        "every part is copied regardless. out must not overlap a part. Releases the GIL while copying.");
}

}  // namespace zrl::python
