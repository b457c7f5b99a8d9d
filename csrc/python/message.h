// zrl._core.MessageBase: the fields of a received message, a plain CPython type
// (wire.Message subclasses it). ZmqNative.drain fills them in C (zmq_native.cc).
#pragma once

#include <Python.h>

namespace zrl::python {

// The fields of a received message (wire.Message is a Python subclass that adds its
// methods): a C type so that ZmqNative.drain can make the learner's messages without
// running Python for each one.
struct MessageObject {
  PyObject_HEAD
  PyObject* kind;
  PyObject* sender_id;
  PyObject* seq;
  PyObject* policy_version;
  PyObject* meta;
  PyObject* infos;
  PyObject* buf;
  PyObject* arrays;  // NULL (None) until wire.Message.arrays makes the views
  PyObject* nbytes;
};

// The type, made by bind_message (nullptr before).
extern PyTypeObject* message_base_type;

}  // namespace zrl::python
