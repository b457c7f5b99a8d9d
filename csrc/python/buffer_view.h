// A Py_buffer for the bindings that take frames through the raw buffer protocol
// (FrameGate.check, send_frame): cheaper per message than py::buffer_info.
#pragma once

#include <Python.h>

namespace zrl::python {

// A Py_buffer released on scope exit; zeroed, so releasing one never filled (a failed
// PyObject_GetBuffer, or one filled by hand with no owner) does nothing.
struct BufferView {
  Py_buffer v{};
  BufferView() = default;
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  ~BufferView() { PyBuffer_Release(&v); }
};

}  // namespace zrl::python
