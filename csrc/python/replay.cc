// zrl._core.PrioritizedReplay and UniformReplay (csrc/replay/); zrl.replay wraps
// them. Arrays are checked and made contiguous with the GIL held (replay_arrays.h);
// the C++ call then runs with the GIL released (it takes the buffer's own mutex
// and never calls back into Python, so the two locks cannot deadlock).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "python/bindings.h"
#include "python/replay_arrays.h"
#include "replay/replay.h"

namespace py = pybind11;

namespace zrl::python {
namespace {

using release_gil = py::call_guard<py::gil_scoped_release>;

}  // namespace

void bind_replay(py::module_& m) {
  py::class_<PrioritizedReplay>(m, "PrioritizedReplay",
                                "Prioritised replay over C++ column storage (see zrl.replay).")
      .def(
          py::init([](py::ssize_t capacity, const py::handle& fields, double alpha, uint64_t seed) {
            if (capacity <= 0) throw py::value_error("capacity: must be positive");
            auto specs = field_specs(fields);
            py::gil_scoped_release release;
            return std::make_unique<PrioritizedReplay>(std::size_t(capacity), std::move(specs),
                                                       alpha, seed);
          }),
          py::arg("capacity"), py::arg("fields"), py::arg("alpha"), py::arg("seed"))
      .def_property_readonly("capacity", &PrioritizedReplay::capacity)
      .def_property_readonly("alpha", &PrioritizedReplay::alpha)
      .def_property_readonly(
          "fields", [](const PrioritizedReplay& self) { return fields_list(self.fields()); })
      .def("__len__", &PrioritizedReplay::size, release_gil())
      .def_property_readonly("max_priority",
                             py::cpp_function(&PrioritizedReplay::max_priority, release_gil()))
      .def(
          "add",
          [](PrioritizedReplay& self, const py::handle& batch, const py::handle& priorities) {
            BatchColumns cols = batch_columns(batch, self.fields());
            py::array_t<double, py::array::c_style> p;
            if (!priorities.is_none()) p = as_float64_vector(priorities, "priorities", cols.rows);
            const double* pp = priorities.is_none() ? nullptr : p.data();
            py::gil_scoped_release release;
            self.add(cols.data.data(), cols.rows, pp);
          },
          py::arg("batch"), py::arg("priorities") = py::none())
      .def(
          "sample",
          [](PrioritizedReplay& self, py::ssize_t batch_size, double beta) {
            const std::size_t n = positive_batch_size(batch_size);
            py::array_t<int64_t> keys(n);
            py::array_t<float> weights(n);
            std::vector<void*> data;
            py::dict batch = new_batch(self.fields(), n, data);
            {
              py::gil_scoped_release release;
              self.sample(n, beta, keys.mutable_data(), weights.mutable_data(), data.data());
            }
            return py::make_tuple(std::move(keys), std::move(weights), std::move(batch));
          },
          py::arg("batch_size"), py::arg("beta"))
      .def(
          "update_priorities",
          [](PrioritizedReplay& self, const py::handle& keys_obj, const py::handle& priorities) {
            auto keys = as_keys(keys_obj);
            auto p = as_float64_vector(priorities, "priorities", std::size_t(keys.shape(0)));
            py::gil_scoped_release release;
            return self.update_priorities(keys.data(), p.data(), std::size_t(keys.shape(0)));
          },
          py::arg("keys"), py::arg("priorities"))
      .def("state_dict",
           [](const PrioritizedReplay& self) {
             zrl::PrioritizedReplayState st;
             {
               py::gil_scoped_release release;
               st = self.export_state();
             }
             py::dict d;
             d["format_version"] = scalar_array<int64_t>(kStateFormat);
             d["capacity"] = scalar_array<int64_t>(int64_t(st.capacity));
             d["alpha"] = scalar_array<double>(st.alpha);
             d["max_priority"] = scalar_array<double>(st.max_priority);
             d["rng_state"] = rng_array(st.rng_state);
             const py::ssize_t size = py::ssize_t(st.storage.size);
             d["scaled_priorities"] =
                 adopt(std::move(st.scaled_priorities), py::dtype::of<float>(), {size});
             put_storage_state(d, std::move(st.storage), self.fields());
             return d;
           })
      .def(
          "load_state_dict",
          [](PrioritizedReplay& self, const py::handle& state) {
            StateReader r(state, storage_state_names(self.fields(), {"alpha", "max_priority",
                                                                     "scaled_priorities"}));
            r.check_format();
            zrl::PrioritizedReplayStateView view;
            view.capacity = r.non_negative("capacity");
            view.alpha = r.float64("alpha");
            view.max_priority = r.float64("max_priority");
            view.rng_state = r.rng_state();
            view.storage = r.storage(self.fields(), self.capacity());
            view.scaled_priorities =
                static_cast<const float*>(r.array("scaled_priorities", py::dtype::of<float>(),
                                                  {py::ssize_t(view.storage.size)})
                                              .data());
            py::gil_scoped_release release;
            self.import_state(view);
          },
          py::arg("state"))
      .def("_tree_total", &PrioritizedReplay::tree_total, release_gil())
      .def("_tree_min", &PrioritizedReplay::tree_min, release_gil())
      .def("_scaled_priorities",
           [](const PrioritizedReplay& self) {
             std::vector<float> v;
             {
               py::gil_scoped_release release;
               v = self.scaled_priorities();
             }
             const py::ssize_t n = py::ssize_t(v.size());
             return adopt(std::move(v), py::dtype::of<float>(), {n});
           })
      .def("_check_invariants", [](const PrioritizedReplay& self) {
        std::string why;
        {
          py::gil_scoped_release release;
          if (self.check_invariants(&why)) why.clear();
        }
        return why;
      });

  py::class_<UniformReplay>(m, "UniformReplay",
                            "Uniform replay over C++ column storage (see zrl.replay).")
      .def(py::init([](py::ssize_t capacity, const py::handle& fields, uint64_t seed) {
             if (capacity <= 0) throw py::value_error("capacity: must be positive");
             auto specs = field_specs(fields);
             py::gil_scoped_release release;
             return std::make_unique<UniformReplay>(std::size_t(capacity), std::move(specs), seed);
           }),
           py::arg("capacity"), py::arg("fields"), py::arg("seed"))
      .def_property_readonly("capacity", &UniformReplay::capacity)
      .def_property_readonly("fields",
                             [](const UniformReplay& self) { return fields_list(self.fields()); })
      .def("__len__", &UniformReplay::size, release_gil())
      .def(
          "add",
          [](UniformReplay& self, const py::handle& batch) {
            BatchColumns cols = batch_columns(batch, self.fields());
            py::gil_scoped_release release;
            self.add(cols.data.data(), cols.rows);
          },
          py::arg("batch"))
      .def(
          "sample",
          [](UniformReplay& self, py::ssize_t batch_size) {
            const std::size_t n = positive_batch_size(batch_size);
            std::vector<void*> data;
            py::dict batch = new_batch(self.fields(), n, data);
            {
              py::gil_scoped_release release;
              self.sample(n, data.data());
            }
            return batch;
          },
          py::arg("batch_size"))
      .def("state_dict",
           [](const UniformReplay& self) {
             zrl::UniformReplayState st;
             {
               py::gil_scoped_release release;
               st = self.export_state();
             }
             py::dict d;
             d["format_version"] = scalar_array<int64_t>(kStateFormat);
             d["capacity"] = scalar_array<int64_t>(int64_t(st.capacity));
             d["rng_state"] = rng_array(st.rng_state);
             put_storage_state(d, std::move(st.storage), self.fields());
             return d;
           })
      .def(
          "load_state_dict",
          [](UniformReplay& self, const py::handle& state) {
            StateReader r(state, storage_state_names(self.fields(), {}));
            r.check_format();
            zrl::UniformReplayStateView view;
            view.capacity = r.non_negative("capacity");
            view.rng_state = r.rng_state();
            view.storage = r.storage(self.fields(), self.capacity());
            py::gil_scoped_release release;
            self.import_state(view);
          },
          py::arg("state"));
}

}  // namespace zrl::python
