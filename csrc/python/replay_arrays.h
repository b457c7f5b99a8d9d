// numpy arrays to and from the replay buffers (csrc/replay/): a batch to add,
// a sampled batch, and the state dicts of a checkpoint (flat {name: array},
// fields under "field/NAME"). Arrays are checked and made contiguous here, with
// the GIL held; what they return stays alive while the caller releases it.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "replay/replay.h"

namespace zrl::python {

// [(name, shape tuple, dtype name)] as normalised by zrl.replay, and back.
std::vector<zrl::FieldSpec> field_specs(const pybind11::handle& fields);
pybind11::list fields_list(const std::vector<zrl::FieldSpec>& fields);

// The arrays of an `add` batch, checked against the fields and kept alive
// (contiguous copies where needed) while the GIL is released.
struct BatchColumns {
  std::vector<pybind11::array> arrays;
  std::vector<const void*> data;
  std::size_t rows = 0;
};
BatchColumns batch_columns(const pybind11::handle& batch_obj, const std::vector<zrl::FieldSpec>& fields);

// A 1-D array of `n` numbers as float64 (any real dtype is converted).
pybind11::array_t<double, pybind11::array::c_style> as_float64_vector(const pybind11::handle& obj, const char* name,
                                                                      std::size_t n);
// Integer keys as returned by sample, as int64.
pybind11::array_t<int64_t, pybind11::array::c_style> as_keys(const pybind11::handle& obj);
std::size_t positive_batch_size(pybind11::ssize_t batch_size);

// Freshly allocated [n, *shape] arrays for every field, and their pointers:
// views into one new block (zrl::batch_layout says where each lies).
pybind11::dict new_batch(const std::vector<zrl::FieldSpec>& fields, std::size_t n, std::vector<void*>& data);

// A std::vector handed to numpy without a copy: the array owns it.
template <typename T>
pybind11::array adopt(std::vector<T>&& v, const pybind11::dtype& dtype, std::vector<pybind11::ssize_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  pybind11::capsule owner(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return pybind11::array(dtype, std::move(shape), {}, owned->data(), owner);
}

template <typename T>
pybind11::array scalar_array(T value) {
  pybind11::array_t<T> a(std::vector<pybind11::ssize_t>{});
  *a.mutable_data() = value;
  return std::move(a);
}

// State dicts: flat {name: numpy array}, fields under "field/NAME".
constexpr int64_t kStateFormat = 1;

void put_storage_state(pybind11::dict& d, zrl::StorageState&& st, const std::vector<zrl::FieldSpec>& fields);
pybind11::array rng_array(const zrl::Xoshiro256pp::State& s);

// The names of a state dict: `names` (the buffer's own) and the storage's.
std::vector<std::string> storage_state_names(const std::vector<zrl::FieldSpec>& fields,
                                             std::vector<std::string> names);

// Reads a state dict back, checking names, dtypes and shapes; the arrays it
// borrows stay alive in `keep_` while the GIL is released.
class StateReader {
 public:
  StateReader(const pybind11::handle& obj, std::vector<std::string> expected);

  pybind11::array array(const std::string& name, const pybind11::dtype& dtype,
                        const std::vector<pybind11::ssize_t>& shape);
  int64_t int64(const std::string& name);
  double float64(const std::string& name);
  std::size_t non_negative(const std::string& name);
  zrl::Xoshiro256pp::State rng_state();
  void check_format();
  zrl::StorageStateView storage(const std::vector<zrl::FieldSpec>& fields, std::size_t capacity);

 private:
  pybind11::dict d_;
  std::vector<pybind11::array> keep_;
};

}  // namespace zrl::python
