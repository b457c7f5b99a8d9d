// The pybind11 module zrl._core: one bind_<domain> call per file of csrc/python
// (bindings.h). Every kernel lives in a plain C++ library that knows nothing of
// Python; the bindings convert arguments, map errors and release the GIL.
#include <pybind11/pybind11.h>

#include <exception>
#include <stdexcept>

#include "python/bindings.h"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "zrl's C++ kernels (see zrl.algorithms.vtrace and zrl.replay for the Python faces)";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const std::out_of_range& e) {
      PyErr_SetString(PyExc_IndexError, e.what());
    }
  });

  zrl::python::bind_vtrace(m);
  zrl::python::bind_join(m);
  zrl::python::bind_pixels(m);
  zrl::python::bind_quantize(m);
  zrl::python::bind_int8(m);
  zrl::python::bind_sampling(m);
  zrl::python::bind_replay(m);
  zrl::python::bind_wire_gate(m);
  zrl::python::bind_send_buffer(m);
  zrl::python::bind_message(m);
  zrl::python::bind_zmq_native(m);
  zrl::python::bind_mlp_policy(m);
  zrl::python::bind_serve_loop(m);
}
