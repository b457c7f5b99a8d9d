// The domains of the pybind11 module zrl._core, one binding file each
// (csrc/python/<domain>.cc); module.cc calls them in turn. The binding files
// convert arguments, map errors and release the GIL around calls into the
// plain C++ libraries of csrc/kernels, csrc/replay and csrc/wire: no logic.
#pragma once

#include <pybind11/pybind11.h>

namespace zrl::python {

void bind_vtrace(pybind11::module_& m);       // vtrace
void bind_join(pybind11::module_& m);         // join_checked
void bind_pixels(pybind11::module_& m);       // pixels_to_channels_last
void bind_quantize(pybind11::module_& m);     // quantize_rows
void bind_int8(pybind11::module_& m);         // int8_layer, int8_layer_kernels
void bind_sampling(pybind11::module_& m);     // sample_categorical
void bind_replay(pybind11::module_& m);       // PrioritizedReplay, UniformReplay
void bind_wire_gate(pybind11::module_& m);    // FrameGate
void bind_send_buffer(pybind11::module_& m);  // SendBuffer
void bind_message(pybind11::module_& m);      // MessageBase
void bind_zmq_native(pybind11::module_& m);   // ZmqFrame, ZmqNative (send_frame, drain)
void bind_mlp_policy(pybind11::module_& m);   // MlpPolicy, sample_gaussian
void bind_serve_loop(pybind11::module_& m);   // ServeLoop

}  // namespace zrl::python
