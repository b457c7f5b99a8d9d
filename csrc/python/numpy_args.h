// Checks of the numpy arrays the bindings receive, shared by every domain.
// Errors are ValueErrors that name the Python argument, so the user knows
// which one is wrong.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

namespace zrl::python {

using FloatArray = pybind11::array_t<float, pybind11::array::c_style>;

// Whether `got` is `want`: the same kind and size in this machine's byte order. (Not
// dtype identity: an unpickled float32 array, or np.longlong for int64, has another
// dtype object of the same type.)
bool is_dtype(const pybind11::dtype& got, const pybind11::dtype& want);

// 2-byte integers holding bfloat16 bits, in this machine's byte order.
bool is_bf16_bits(const pybind11::dtype& dt);

// A float32 array of exactly `ndim` dims, C-contiguous (copied if it was not).
FloatArray as_float32(const pybind11::handle& obj, const char* name, pybind11::ssize_t ndim);

// The kernels read and write through raw pointers of their element type.
void require_aligned(const pybind11::array& arr, const char* name);

}  // namespace zrl::python
