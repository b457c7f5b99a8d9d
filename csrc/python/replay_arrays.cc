#include "python/replay_arrays.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "python/numpy_args.h"
#include "replay/batch_layout.h"

namespace py = pybind11;

namespace zrl::python {
namespace {

py::dtype numpy_dtype(zrl::DType dtype) {
  switch (dtype) {
    case zrl::DType::kFloat32:
      return py::dtype::of<float>();
    case zrl::DType::kUInt8:
      return py::dtype::of<uint8_t>();
    case zrl::DType::kInt64:
      return py::dtype::of<int64_t>();
    case zrl::DType::kBool:
      return py::dtype::of<bool>();
  }
  throw std::logic_error("unknown dtype");
}

std::string shape_str(const std::vector<py::ssize_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + (shape[i] < 0 ? std::string("N") : std::to_string(shape[i]));
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::string array_shape_str(const py::array& a) {
  return shape_str(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
}

std::string type_name(const py::handle& obj) {
  return std::string(py::str(py::type::of(obj).attr("__name__")));
}

std::vector<py::ssize_t> leading(py::ssize_t n, const zrl::FieldSpec& spec) {
  std::vector<py::ssize_t> shape{n};
  shape.insert(shape.end(), spec.shape.begin(), spec.shape.end());
  return shape;
}

}  // namespace

std::vector<zrl::FieldSpec> field_specs(const py::handle& fields) {
  std::vector<zrl::FieldSpec> specs;
  for (const py::handle& item : py::iter(fields)) {
    auto t = py::reinterpret_borrow<py::tuple>(item);
    if (t.size() != 3) throw py::value_error("fields: expected (name, shape, dtype) triples");
    zrl::FieldSpec spec;
    spec.name = t[0].cast<std::string>();
    for (const py::handle& d : t[1]) spec.shape.push_back(d.cast<int64_t>());
    spec.dtype = zrl::dtype_from_name(t[2].cast<std::string>());
    specs.push_back(std::move(spec));
  }
  return specs;
}

BatchColumns batch_columns(const py::handle& batch_obj, const std::vector<zrl::FieldSpec>& fields) {
  if (!py::isinstance<py::dict>(batch_obj))
    throw py::value_error("batch: expected a dict of numpy arrays, got " + type_name(batch_obj));
  auto batch = py::reinterpret_borrow<py::dict>(batch_obj);
  for (const auto& kv : batch) {
    const std::string key = py::str(kv.first);
    bool known = false;
    for (const auto& f : fields) known = known || f.name == key;
    if (!known) throw py::value_error("batch: unexpected field '" + key + "'");
  }
  BatchColumns cols;
  for (const auto& f : fields) {
    const std::string name = "batch['" + f.name + "']";
    if (!batch.contains(f.name)) throw py::value_error("batch: missing field '" + f.name + "'");
    py::object obj = batch[py::str(f.name)];
    if (!py::isinstance<py::array>(obj))
      throw py::value_error(name + ": expected a numpy array, got " + type_name(obj));
    auto arr = py::reinterpret_borrow<py::array>(obj);
    const py::dtype want = numpy_dtype(f.dtype);
    if (!is_dtype(arr.dtype(), want))
      throw py::value_error(name + ": expected dtype " + zrl::dtype_name(f.dtype) + ", got " +
                            std::string(py::str(arr.dtype())));
    bool shape_ok = arr.ndim() == py::ssize_t(f.shape.size()) + 1;
    for (std::size_t d = 0; shape_ok && d < f.shape.size(); ++d)
      shape_ok = arr.shape(d + 1) == f.shape[d];
    if (!shape_ok)
      throw py::value_error(name + ": expected shape " + shape_str(leading(-1, f)) + ", got " +
                            array_shape_str(arr));
    if (cols.arrays.empty()) {
      cols.rows = static_cast<std::size_t>(arr.shape(0));
    } else if (static_cast<std::size_t>(arr.shape(0)) != cols.rows) {
      throw py::value_error(name + ": has " + std::to_string(arr.shape(0)) + " rows but batch['" +
                            fields[0].name + "'] has " + std::to_string(cols.rows));
    }
    arr = py::array::ensure(arr, py::array::c_style);
    cols.data.push_back(arr.data());
    cols.arrays.push_back(std::move(arr));
  }
  return cols;
}

py::array_t<double, py::array::c_style> as_float64_vector(const py::handle& obj, const char* name,
                                                          std::size_t n) {
  py::array arr = py::array::ensure(obj);
  if (!arr ||
      (arr.dtype().kind() != 'f' && arr.dtype().kind() != 'i' && arr.dtype().kind() != 'u')) {
    PyErr_Clear();
    throw py::value_error(std::string(name) + ": expected an array of real numbers");
  }
  if (arr.ndim() != 1 || static_cast<std::size_t>(arr.shape(0)) != n)
    throw py::value_error(std::string(name) + ": expected shape (" + std::to_string(n) +
                          ",), got " + array_shape_str(arr));
  return py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(arr);
}

py::array_t<int64_t, py::array::c_style> as_keys(const py::handle& obj) {
  py::array arr = py::array::ensure(obj);
  if (!arr || (arr.dtype().kind() != 'i' && arr.dtype().kind() != 'u')) {
    PyErr_Clear();
    throw py::value_error("keys: expected an array of integer keys as returned by sample");
  }
  if (arr.ndim() != 1)
    throw py::value_error("keys: expected shape (N,), got " + array_shape_str(arr));
  return py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
}

std::size_t positive_batch_size(py::ssize_t batch_size) {
  if (batch_size <= 0)
    throw py::value_error("batch_size: must be positive, got " + std::to_string(batch_size));
  return static_cast<std::size_t>(batch_size);
}

py::dict new_batch(const std::vector<zrl::FieldSpec>& fields, std::size_t n,
                   std::vector<void*>& data) {
  const zrl::BatchLayout layout = zrl::batch_layout(fields, n);
  py::array_t<uint8_t> block(static_cast<py::ssize_t>(layout.bytes + zrl::kBatchAlign));
  uint8_t* base = block.mutable_data();
  base += (zrl::kBatchAlign - reinterpret_cast<std::uintptr_t>(base) % zrl::kBatchAlign) % zrl::kBatchAlign;
  py::dict batch;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const auto& f = fields[i];
    py::array a(numpy_dtype(f.dtype), leading(py::ssize_t(n), f), {}, base + layout.offsets[i], block);
    data.push_back(base + layout.offsets[i]);
    batch[py::str(f.name)] = std::move(a);
  }
  return batch;
}

void put_storage_state(py::dict& d, zrl::StorageState&& st,
                       const std::vector<zrl::FieldSpec>& fields) {
  d["size"] = scalar_array<int64_t>(int64_t(st.size));
  d["cursor"] = scalar_array<int64_t>(int64_t(st.cursor));
  d["generations"] =
      adopt(std::move(st.generations), py::dtype::of<int64_t>(), {py::ssize_t(st.size)});
  for (std::size_t f = 0; f < fields.size(); ++f)
    d[py::str("field/" + fields[f].name)] =
        adopt(std::move(st.columns[f]), numpy_dtype(fields[f].dtype),
              leading(py::ssize_t(st.size), fields[f]));
}

py::array rng_array(const zrl::Xoshiro256pp::State& s) {
  return adopt(std::vector<uint64_t>(s.begin(), s.end()), py::dtype::of<uint64_t>(), {4});
}

StateReader::StateReader(const py::handle& obj, std::vector<std::string> expected) {
  if (!py::isinstance<py::dict>(obj))
    throw py::value_error("state: expected a dict of numpy arrays, got " + type_name(obj));
  d_ = py::reinterpret_borrow<py::dict>(obj);
  for (const auto& name : expected)
    if (!d_.contains(name)) throw py::value_error("state: missing '" + name + "'");
  for (const auto& kv : d_) {
    const std::string key = py::str(kv.first);
    if (std::find(expected.begin(), expected.end(), key) == expected.end())
      throw py::value_error("state: unexpected '" + key + "'");
  }
}

py::array StateReader::array(const std::string& name, const py::dtype& dtype,
                             const std::vector<py::ssize_t>& shape) {
  py::object obj = d_[py::str(name)];
  if (!py::isinstance<py::array>(obj))
    throw py::value_error("state['" + name + "']: expected a numpy array, got " + type_name(obj));
  auto arr = py::reinterpret_borrow<py::array>(obj);
  if (!is_dtype(arr.dtype(), dtype))
    throw py::value_error("state['" + name + "']: expected dtype " + std::string(py::str(dtype)) +
                          ", got " + std::string(py::str(arr.dtype())));
  if (std::vector<py::ssize_t>(arr.shape(), arr.shape() + arr.ndim()) != shape)
    throw py::value_error("state['" + name + "']: expected shape " + shape_str(shape) + ", got " +
                          array_shape_str(arr));
  arr = py::array::ensure(arr, py::array::c_style);
  keep_.push_back(arr);
  return arr;
}

int64_t StateReader::int64(const std::string& name) {
  return *static_cast<const int64_t*>(array(name, py::dtype::of<int64_t>(), {}).data());
}

double StateReader::float64(const std::string& name) {
  return *static_cast<const double*>(array(name, py::dtype::of<double>(), {}).data());
}

std::size_t StateReader::non_negative(const std::string& name) {
  const int64_t v = int64(name);
  if (v < 0) throw py::value_error("state['" + name + "']: must be >= 0");
  return static_cast<std::size_t>(v);
}

zrl::Xoshiro256pp::State StateReader::rng_state() {
  const auto* p =
      static_cast<const uint64_t*>(array("rng_state", py::dtype::of<uint64_t>(), {4}).data());
  return {p[0], p[1], p[2], p[3]};
}

void StateReader::check_format() {
  if (int64("format_version") != kStateFormat)
    throw py::value_error("state['format_version']: expected " + std::to_string(kStateFormat));
}

zrl::StorageStateView StateReader::storage(const std::vector<zrl::FieldSpec>& fields, std::size_t capacity) {
  zrl::StorageStateView view;
  view.size = non_negative("size");
  if (view.size > capacity)  // before the arrays' shapes are checked against it
    throw py::value_error("state['size']: " + std::to_string(view.size) +
                          " exceeds the capacity " + std::to_string(capacity));
  view.cursor = non_negative("cursor");
  view.generations = static_cast<const int64_t*>(
      array("generations", py::dtype::of<int64_t>(), {py::ssize_t(view.size)}).data());
  for (const auto& f : fields)
    view.columns.push_back(
        array("field/" + f.name, numpy_dtype(f.dtype), leading(py::ssize_t(view.size), f))
            .data());
  return view;
}

std::vector<std::string> storage_state_names(const std::vector<zrl::FieldSpec>& fields,
                                             std::vector<std::string> names) {
  for (const char* n : {"format_version", "capacity", "size", "cursor", "generations", "rng_state"})
    names.push_back(n);
  for (const auto& f : fields) names.push_back("field/" + f.name);
  return names;
}

py::list fields_list(const std::vector<zrl::FieldSpec>& fields) {
  py::list out;
  for (const auto& f : fields) {
    py::tuple shape(f.shape.size());
    for (std::size_t d = 0; d < f.shape.size(); ++d) shape[d] = f.shape[d];
    out.append(py::make_tuple(f.name, shape, zrl::dtype_name(f.dtype)));
  }
  return out;
}

}  // namespace zrl::python
