// zrl._core.SendBuffer: a frame buffer that libzmq sends without a copy
// (zrl::SendBlock, csrc/wire/zmq_native.h), a plain CPython type that
// send_frame recognises (zmq_native.cc).
#pragma once

#include <Python.h>

#include "wire/zmq_native.h"

namespace zrl::python {

// A frame buffer that libzmq sends without a copy (zrl::SendBlock): wire.OutMessage
// keeps a large frame in one, and send_frame sends it zero-copy. Writable through
// the buffer protocol; in_flight counts the messages libzmq still holds.
struct SendBufferObject {
  PyObject_HEAD
  zrl::SendBlock* block;
};

// The type, made by bind_send_buffer (nullptr before).
extern PyTypeObject* send_buffer_type;

}  // namespace zrl::python
