// zrl._core.FrameGate (csrc/wire/wire_gate.h).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "python/bindings.h"
#include "python/buffer_view.h"
#include "wire/wire_gate.h"

namespace py = pybind11;

namespace zrl::python {
namespace {

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

}  // namespace

void bind_wire_gate(py::module_& m) {
  py::class_<zrl::FrameGate>(m, "FrameGate",
                             "Checks frames of one kind against descriptor blocks Python accepted "
                             "before (csrc/wire/wire_gate.h); zrl.wire.Gate wraps it.")
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

}  // namespace zrl::python
