// zrl._core.ZmqNative (csrc/wire/zmq_native.h): pyzmq's own libzmq reached from
// C++, for the per-message send (send_frame) and the receiver's bursts (drain).
// Both are METH_FASTCALL functions rather than pybind11 methods: they run once per
// message, where pybind11's argument conversion would cost more than the work.
#include <pybind11/pybind11.h>

#include <cerrno>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "python/bindings.h"
#include "python/buffer_view.h"
#include "python/message.h"
#include "python/send_buffer.h"
#include "wire/wire_gate.h"
#include "wire/zmq_native.h"

namespace py = pybind11;

namespace zrl::python {
namespace {

// A received message too large to copy: Python reads it through the buffer
// protocol (a read-only memoryview) and libzmq frees it when the last view goes.
// A plain CPython type rather than a pybind11 class: creating one and filling its
// buffer costs a fraction of what pybind11's instance and buffer_info cost, on
// every message the learner receives (bench/TRANSPORT.md).
struct ZmqFrameObject {
  PyObject_HEAD
  const zrl::ZmqApi* api;
  zrl::ZmqMsg msg;
};

void zmq_frame_dealloc(PyObject* self) {
  auto* f = reinterpret_cast<ZmqFrameObject*>(self);
  f->api->msg_close(&f->msg);
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free(self);
  Py_DECREF(type);  // a heap type: each instance holds a reference to it
}

int zmq_frame_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  auto* f = reinterpret_cast<ZmqFrameObject*>(self);
  return PyBuffer_FillInfo(view, self, f->api->msg_data(&f->msg), static_cast<Py_ssize_t>(f->api->msg_size(&f->msg)),
                           /*readonly=*/1, flags);
}

PyType_Slot kZmqFrameSlots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(zmq_frame_dealloc)},
    {Py_bf_getbuffer, reinterpret_cast<void*>(zmq_frame_getbuffer)},
    {Py_tp_doc, const_cast<char*>("A received message, freed with its last view.")},
    {0, nullptr}};

// Only drain makes them (Python cannot: an instance without a message would crash).
PyType_Spec kZmqFrameSpec = {"zrl._core.ZmqFrame", sizeof(ZmqFrameObject), 0,
                             Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, kZmqFrameSlots};

PyTypeObject* zmq_frame_type = nullptr;  // made in bind_zmq_native

// The METH_FASTCALL functions' integer arguments args[at[k]] into out[k], as
// struct.pack_into takes them (anything with __index__, numpy's too), each checked
// before the next runs: false with the Python error set.
template <typename T, std::size_t N>
bool index_args(PyObject* const* args, const int (&at)[N], T (&out)[N]) {
  static_assert(std::is_same_v<T, long long> || std::is_same_v<T, unsigned long long>);
  for (std::size_t k = 0; k < N; ++k) {
    PyObject* i = PyNumber_Index(args[at[k]]);
    if (!i) return false;
    if constexpr (std::is_same_v<T, long long>) {
      out[k] = PyLong_AsLongLong(i);
    } else {
      out[k] = PyLong_AsUnsignedLongLong(i);
    }
    Py_DECREF(i);
    if (out[k] == static_cast<T>(-1) && PyErr_Occurred()) return false;
  }
  return true;
}

// send_frame(socket, frame, total, seq, policy_version, wait[, to, from, n]) -> 0 or
// zmq errno: an actor sends each chunk through this, so it is a METH_FASTCALL function
// rather than a pybind11 method (whose argument conversion costs more than the send).
// It stamps seq / policy_version / total into the frame's header and sends
// frame[:total] on the libzmq socket at `socket` (pyzmq's Socket.underlying), first
// without waiting; if the queue is full and `wait`, again with the GIL released. With
// (to, from, n), once a copied frame has gone (0 returned), it copies frame[from:from+n]
// to frame[to:to+n]: the next chunk's bootstrap row, in the same call.
PyObject* native_send_frame(PyObject* capsule, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6 && nargs != 9) {
    PyErr_SetString(PyExc_TypeError, "send_frame(socket, frame, total, seq, policy_version, wait[, to, from, n])");
    return nullptr;
  }
  auto* api = static_cast<const zrl::ZmqApi*>(PyCapsule_GetPointer(capsule, "zrl.ZmqApi"));
  if (!api) return nullptr;
  unsigned long long v[4];  // socket, total, seq, policy_version
  if (!index_args(args, {0, 2, 3, 4}, v)) return nullptr;
  const int wait = PyObject_IsTrue(args[5]);
  if (wait < 0) return nullptr;
  void* sock = reinterpret_cast<void*>(static_cast<uintptr_t>(v[0]));
  const unsigned long long total = v[1], seq = v[2], version = v[3];
  if (!sock) {
    PyErr_SetString(PyExc_ValueError, "send_frame: null socket");
    return nullptr;
  }
  // The frame: a SendBuffer goes out without a copy (libzmq holds the block until it has
  // sent it); any other writable buffer of bytes is copied by zmq_send.
  zrl::SendBlock* block = nullptr;
  BufferView view;  // (for a SendBuffer, filled here with no owner: nothing to release)
  if (Py_TYPE(args[1]) == send_buffer_type) {
    block = reinterpret_cast<SendBufferObject*>(args[1])->block;
    if (zrl::in_flight(*block) != 0) {  // stamping it would change a message libzmq is sending
      PyErr_SetString(PyExc_ValueError, "send_frame: the SendBuffer is still in flight");
      return nullptr;
    }
    view.v.buf = block->data;
    view.v.len = static_cast<Py_ssize_t>(block->size);
    view.v.itemsize = 1;
  } else if (PyObject_GetBuffer(args[1], &view.v, PyBUF_WRITABLE) != 0) {
    return nullptr;
  }
  auto* data = static_cast<uint8_t*>(view.v.buf);
  zrl::RowCopy row;
  if (nargs == 9) {
    if (block) {  // (libzmq may still be reading it: nothing may write into it now)
      PyErr_SetString(PyExc_ValueError, "send_frame: a row copy needs a frame that goes out copied, not a SendBuffer");
      return nullptr;
    }
    unsigned long long r[3];  // to, from, n
    if (!index_args(args, {6, 7, 8}, r)) return nullptr;
    row = zrl::RowCopy{r[0], r[1], r[2]};
    if (!row.fits(static_cast<std::size_t>(view.v.len))) {
      PyErr_Format(PyExc_ValueError, "send_frame: row copy [%llu, +%llu) <- [%llu, +%llu) outside a %zd-byte frame",
                   r[0], r[2], r[1], r[2], view.v.len);
      return nullptr;
    }
  }
  if (view.v.itemsize != 1 || !zrl::stamp_header(data, static_cast<std::size_t>(view.v.len), seq, version, total)) {
    PyErr_Format(PyExc_ValueError, "send_frame: total %llu outside a %zd-byte frame of bytes", total, view.v.len);
    return nullptr;
  }
  auto send = [&](int flags) {
    return block ? zrl::send_zero_copy(*api, sock, block, total, flags) : zrl::send(*api, sock, data, total, flags);
  };
  int err = send(zrl::kZmqDontWait);
  if (err == EAGAIN && wait) {
    Py_BEGIN_ALLOW_THREADS
    err = send(0);
    Py_END_ALLOW_THREADS
  }
  if (err == 0) row.apply(data);  // (zmq_send copied the frame)
  return PyLong_FromLong(err);
}

PyMethodDef kSendFrameDef = {
    "send_frame", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(native_send_frame)), METH_FASTCALL,
    "send_frame(socket, frame, total, seq, policy_version, wait[, to, from, n]) -> 0 or the zmq errno (EAGAIN: "
    "the queue is full and wait is false). Stamps seq, policy_version and total into the frame's header and sends "
    "frame[:total] on the libzmq socket at address `socket` (pyzmq's Socket.underlying): a SendBuffer "
    "without a copy (libzmq holds it until sent: see SendBuffer.in_flight), anything else copied. With "
    "(to, from, n), a frame that went out copied then gets frame[to:to+n] = frame[from:from+n]."};

// (items, unvouched) for up to `max` messages, the first waited for up to wait_ms
// (zrl::drain). An item is (message, bindings) for a frame the FrameGate vouched for:
// a `message_type` (a subclass of MessageBase) of kind `kind`, its infos and bindings
// from layouts[layout] = (infos, bindings, block); anything else is its payload, for
// Python's checks, and `unvouched` counts those. A payload is bytes below copy_below,
// else a read-only memoryview that keeps the message.
py::tuple drain_items(const zrl::ZmqApi* api, void* socket, const zrl::FrameGate& gate, std::size_t max,
                    std::size_t copy_below, int wait_ms, const py::list& layouts, PyTypeObject* mtype,
                    const py::handle& kind) {
  // A burst of its own per call (one ZmqNative serves every gate and thread in the
  // process), its storage kept per thread: room for 64 messages is an allocation of
  // kilobytes, a sizeable part of a small message's receive. Taken out of the cache
  // for the call, so a nested call (a finalizer run by the allocations below) makes its own.
  thread_local std::vector<zrl::Drained> cache;
  std::vector<zrl::Drained> burst = std::move(cache);
  struct GiveBack {
    std::vector<zrl::Drained>& burst;
    ~GiveBack() {
      burst.clear();  // (every message is closed by then: CloseAll below runs first)
      if (burst.capacity() > cache.capacity()) cache = std::move(burst);
    }
  } give_back{burst};
  int err;
  {
    py::gil_scoped_release release;
    err = zrl::drain(*api, socket, gate, max, &burst, wait_ms);
  }
  const std::size_t n = burst.size();
  // Every message of the burst is closed on the way out, whatever happens below;
  // a large one has been moved into its ZmqFrame by then (closing the empty rest is a no-op).
  struct CloseAll {
    const zrl::ZmqApi* api;
    std::vector<zrl::Drained>& burst;
    ~CloseAll() {
      for (auto& d : burst) api->msg_close(&d.msg);
    }
  } close_all{api, burst};
  if (n == 0 && err != 0) {
    PyErr_SetObject(PyExc_OSError, py::make_tuple(err, api->strerror(err)).ptr());
    throw py::error_already_set();
  }
  const std::size_t n_layouts = layouts.size();
  std::size_t unvouched = 0;
  py::list out(n);
  for (std::size_t i = 0; i < n; ++i) {
    zrl::ZmqMsg* msg = &burst[i].msg;
    const std::size_t size = api->msg_size(msg);
    py::object payload;
    if (size < copy_below) {
      payload = py::bytes(static_cast<const char*>(api->msg_data(msg)), size);
    } else {  // no copy: Python gets a view, and the message lives as long as the view
      auto* frame = PyObject_New(ZmqFrameObject, zmq_frame_type);
      if (!frame) throw py::error_already_set();
      frame->api = api;
      api->msg_init(&frame->msg);
      api->msg_move(&frame->msg, msg);
      py::object owner = py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(frame));
      payload = py::reinterpret_steal<py::object>(PyMemoryView_FromObject(owner.ptr()));
      if (!payload) throw py::error_already_set();
    }
    const zrl::GateResult& g = burst[i].gate;
    py::object item;
    if (g.layout >= 0 && static_cast<std::size_t>(g.layout) < n_layouts) {
      py::tuple entry = layouts[static_cast<std::size_t>(g.layout)];  // (infos, bindings, block)
      py::object meta = g.meta_len ? payload[py::slice(static_cast<py::ssize_t>(g.meta_offset),
                                                       static_cast<py::ssize_t>(g.meta_offset + g.meta_len), 1)]
                                   : py::bytes();
      py::object m = py::reinterpret_steal<py::object>(mtype->tp_alloc(mtype, 0));
      if (!m) throw py::error_already_set();
      auto* f = reinterpret_cast<MessageObject*>(m.ptr());
      f->kind = kind.inc_ref().ptr();
      f->sender_id = py::int_(g.sender_id).release().ptr();
      f->seq = py::int_(g.seq).release().ptr();
      f->policy_version = py::int_(g.policy_version).release().ptr();
      f->meta = meta.release().ptr();
      f->infos = py::object(entry[0]).release().ptr();
      f->buf = payload.release().ptr();
      f->nbytes = py::int_(size).release().ptr();
      item = py::make_tuple(std::move(m), entry[1]);
    } else {
      item = std::move(payload);
      ++unvouched;
    }
    PyList_SET_ITEM(out.ptr(), static_cast<py::ssize_t>(i), item.release().ptr());
  }
  return py::make_tuple(std::move(out), unvouched);
}

// drain(socket, gate, max, copy_below, wait_ms, layouts, message_type, kind) ->
// (items, unvouched): the learner's receiver calls this for every burst, so it is a
// METH_FASTCALL function (pybind11's argument conversion of eight arguments costs
// as much as a small message's receive).
PyObject* native_drain(PyObject* capsule, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 8) {
    PyErr_SetString(PyExc_TypeError, "drain(socket, gate, max, copy_below, wait_ms, layouts, message_type, kind)");
    return nullptr;
  }
  auto* api = static_cast<const zrl::ZmqApi*>(PyCapsule_GetPointer(capsule, "zrl.ZmqApi"));
  if (!api) return nullptr;
  long long v[4];  // socket, max, copy_below, wait_ms
  if (!index_args(args, {0, 2, 3, 4}, v)) return nullptr;
  if (v[0] == 0 || v[1] < 0 || v[2] < 0 || v[3] < -1 || v[3] > INT32_MAX) {
    PyErr_Format(PyExc_ValueError, "drain: socket %lld, max %lld, copy_below %lld, wait_ms %lld out of range", v[0],
                 v[1], v[2], v[3]);
    return nullptr;
  }
  if (!PyList_Check(args[5])) {
    PyErr_SetString(PyExc_TypeError, "drain: layouts must be a list");
    return nullptr;
  }
  if (!PyType_Check(args[6]) || !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(args[6]), message_base_type)) {
    PyErr_SetString(PyExc_TypeError, "drain: message_type must be a subclass of zrl._core.MessageBase");
    return nullptr;
  }
  try {
    const auto& gate = py::cast<const zrl::FrameGate&>(py::handle(args[1]));
    return drain_items(api, reinterpret_cast<void*>(static_cast<uintptr_t>(v[0])), gate, static_cast<std::size_t>(v[1]),
                       static_cast<std::size_t>(v[2]), static_cast<int>(v[3]),
                       py::reinterpret_borrow<py::list>(args[5]), reinterpret_cast<PyTypeObject*>(args[6]),
                       py::handle(args[7]))
        .release()
        .ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::cast_error&) {
    PyErr_SetString(PyExc_TypeError, "drain: gate must be a zrl._core.FrameGate");
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

PyMethodDef kDrainDef = {
    "drain", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(native_drain)), METH_FASTCALL,
    "drain(socket, gate, max, copy_below, wait_ms, layouts, message_type, kind) -> (items, unvouched). Up to "
    "`max` messages from the libzmq socket at address `socket` (pyzmq's Socket.underlying), each checked by "
    "the FrameGate `gate`, the first waited for up to `wait_ms` (0: not at all, -1: for ever; a blocking "
    "receive without the GIL), the rest not at all. An item is (message_type instance of kind `kind`, "
    "bindings) where the gate vouched for the frame with layouts[layout] = (infos, bindings, block), else the "
    "frame's payload (bytes, or a read-only memoryview from copy_below bytes up); unvouched counts those. An "
    "OSError(errno) for a failed receive with nothing received. Any thread, but one per socket (and per "
    "gate), as ZeroMQ requires."};

// pyzmq's libzmq reached from C++; zrl.transport.native() builds one.
class ZmqNative {
 public:
  ZmqNative(const std::string& module, int major, int minor, int patch) {
    std::string why;
    api_ = zrl::ZmqApi::attach(module, major, minor, patch, &why);
    if (!api_) throw std::runtime_error(why);
  }
  const std::string& library() const { return api_->library; }

  // send_frame(socket, frame, total, seq, policy_version, wait) as a plain CPython
  // function bound to this library (see native_send_frame).
  py::object send_frame_function() const {
    py::capsule api(const_cast<zrl::ZmqApi*>(api_), "zrl.ZmqApi");
    PyObject* f = PyCFunction_New(&kSendFrameDef, api.ptr());
    if (!f) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(f);
  }

  // drain(socket, gate, max, copy_below, wait_ms, layouts, message_type, kind) as a
  // plain CPython function bound to this library (see native_drain).
  py::object drain_function() const {
    py::capsule api(const_cast<zrl::ZmqApi*>(api_), "zrl.ZmqApi");
    PyObject* f = PyCFunction_New(&kDrainDef, api.ptr());
    if (!f) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(f);
  }

 private:
  const zrl::ZmqApi* api_ = nullptr;
};

}  // namespace

void bind_zmq_native(py::module_& m) {
  zmq_frame_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&kZmqFrameSpec));
  if (!zmq_frame_type) throw py::error_already_set();
  m.attr("ZmqFrame") = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(zmq_frame_type));
  py::class_<ZmqNative>(m, "ZmqNative",
                        "pyzmq's own libzmq, reached from C++ for the per-message send and receive loops "
                        "(csrc/wire/zmq_native.h). RuntimeError, with the reason, where it cannot be found.")
      .def(py::init<const std::string&, int, int, int>(), py::arg("module"), py::arg("major"), py::arg("minor"),
           py::arg("patch"))
      .def_property_readonly("library", &ZmqNative::library)
      .def_property_readonly("send_frame", &ZmqNative::send_frame_function,
                             "send_frame(socket, frame, total, seq, policy_version, wait[, to, from, n]) -> 0 or "
                             "the zmq errno (EAGAIN: the queue is full and wait is false): stamps seq, "
                             "policy_version and total into the frame's header and sends frame[:total] on the "
                             "libzmq socket at address `socket` (pyzmq's Socket.underlying): a SendBuffer without "
                             "a copy, anything else copied (then, with to/from/n, one row copy within the frame).")
      .def_property_readonly("drain", &ZmqNative::drain_function,
                             "drain(socket, gate, max, copy_below, wait_ms, layouts, message_type, kind) -> "
                             "(items, unvouched): a burst of checked messages (see its own doc); each access "
                             "makes the function anew, so keep it.");
}

}  // namespace zrl::python
