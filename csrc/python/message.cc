#include "python/message.h"

#include <pybind11/pybind11.h>
#include <structmember.h>  // T_OBJECT_EX (Python.h has it as Py_T_OBJECT_EX from 3.12 only)

#include <cstddef>

#include "python/bindings.h"

namespace py = pybind11;

namespace zrl::python {
namespace {

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

}  // namespace

PyTypeObject* message_base_type = nullptr;

void bind_message(py::module_& m) {
  message_base_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&kMessageSpec));
  if (!message_base_type) throw py::error_already_set();
  m.attr("MessageBase") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(message_base_type));
}

}  // namespace zrl::python
