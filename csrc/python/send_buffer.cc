#include "python/send_buffer.h"

#include <pybind11/pybind11.h>

#include <cstddef>

#include "python/bindings.h"

namespace py = pybind11;

namespace zrl::python {
namespace {

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

}  // namespace

PyTypeObject* send_buffer_type = nullptr;

void bind_send_buffer(py::module_& m) {
  send_buffer_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&kSendBufferSpec));
  if (!send_buffer_type) throw py::error_already_set();
  m.attr("SendBuffer") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(send_buffer_type));
}

}  // namespace zrl::python
