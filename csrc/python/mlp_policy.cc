// zrl._core.MlpPolicy and sample_gaussian (csrc/kernels/mlp_policy.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/mlp_policy.h"
#include "python/bindings.h"
#include "python/numpy_args.h"

namespace py = pybind11;

namespace zrl::python {
namespace {

std::vector<float> values(const py::handle& obj, const char* name, py::ssize_t ndim) {
  FloatArray a = as_float32(obj, name, ndim);
  return std::vector<float>(a.data(), a.data() + a.size());
}

// (weight [out, in], bias [out]) as torch.nn.Linear holds them.
zrl::Dense dense(const py::handle& pair, const std::string& name) {
  auto t = py::cast<py::tuple>(pair);
  if (t.size() != 2) throw py::value_error(name + ": expected (weight, bias)");
  FloatArray w = as_float32(t[0], (name + ".weight").c_str(), 2);
  zrl::Dense d;
  d.out = static_cast<std::size_t>(w.shape(0));
  d.in = static_cast<std::size_t>(w.shape(1));
  d.weight.assign(w.data(), w.data() + w.size());
  d.bias = values(t[1], (name + ".bias").c_str(), 1);
  return d;
}

std::shared_ptr<zrl::MlpPolicy> make_policy(std::size_t obs_dim, const py::list& torso, const std::string& activation,
                                            const py::tuple& head, const py::object& norm) {
  std::vector<zrl::Dense> layers;
  for (std::size_t k = 0; k < torso.size(); ++k) layers.push_back(dense(torso[k], "torso[" + std::to_string(k) + "]"));
  zrl::Activation act;
  if (activation == "tanh") {
    act = zrl::Activation::kTanh;
  } else if (activation == "relu") {
    act = zrl::Activation::kRelu;
  } else {
    throw py::value_error("activation: tanh or relu, got " + activation);
  }
  zrl::ObsNormalizer n;
  if (!norm.is_none()) {
    auto t = py::cast<py::tuple>(norm);
    if (t.size() != 4) throw py::value_error("norm: expected (mean, var, clip, eps)");
    n.mean = values(t[0], "norm.mean", 1);
    n.var = values(t[1], "norm.var", 1);
    n.clip = py::cast<float>(t[2]);
    n.eps = py::cast<float>(t[3]);
  }
  return std::make_shared<zrl::MlpPolicy>(obs_dim, std::move(layers), act, dense(head, "head"), std::move(n));
}

py::array_t<float> forward(zrl::MlpPolicy& p, const py::handle& obs_obj) {
  FloatArray obs = as_float32(obs_obj, "obs", 2);
  if (static_cast<std::size_t>(obs.shape(1)) != p.obs_dim())
    throw py::value_error("obs: expected rows of " + std::to_string(p.obs_dim()) + " values");
  const py::ssize_t b = obs.shape(0);
  py::array_t<float> out({b, static_cast<py::ssize_t>(p.out_dim())});
  p.forward(obs.data(), static_cast<std::size_t>(b), out.mutable_data());
  return out;
}

py::tuple sample_gaussian(const py::handle& mean_obj, const py::handle& log_std_obj, const py::handle& normals_obj) {
  FloatArray mean = as_float32(mean_obj, "mean", 2);
  FloatArray log_std = as_float32(log_std_obj, "log_std", 1);
  auto normals = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(normals_obj);
  const py::ssize_t b = mean.shape(0), a = mean.shape(1);
  if (!normals || normals.ndim() != 2 || normals.shape(0) != b || normals.shape(1) != a || log_std.shape(0) != a)
    throw py::value_error("sample_gaussian: mean [B, A], log_std [A] and normals [B, A] must agree");
  py::array_t<float> actions({b, a});
  py::array_t<float> logp(b);
  const std::size_t done = zrl::sample_gaussian(mean.data(), static_cast<std::size_t>(b), static_cast<std::size_t>(a),
                                                log_std.data(), normals.data(), actions.mutable_data(),
                                                logp.mutable_data());
  if (done != static_cast<std::size_t>(b))
    throw py::value_error("mean: row " + std::to_string(done) + " gives an action or log-probability that is not finite");
  return py::make_tuple(actions, logp);
}

}  // namespace

void bind_mlp_policy(py::module_& m) {
  py::class_<zrl::MlpPolicy, std::shared_ptr<zrl::MlpPolicy>>(
      m, "MlpPolicy",
      "The policy half of an MLP actor-critic without a framework (csrc/kernels/mlp_policy.h): "
      "MlpPolicy(obs_dim, torso=[(weight, bias), ...], activation='tanh'|'relu', head=(weight, bias), "
      "norm=None | (mean, var, clip, eps)); weights as torch.nn.Linear holds them.")
      .def(py::init(&make_policy), py::arg("obs_dim"), py::arg("torso"), py::arg("activation"), py::arg("head"),
           py::arg("norm") = py::none())
      .def_property_readonly("obs_dim", &zrl::MlpPolicy::obs_dim)
      .def_property_readonly("out_dim", &zrl::MlpPolicy::out_dim)
      .def("forward", &forward, py::arg("obs"), "Policy parameters float32 [B, out_dim] of obs float32 [B, obs_dim].");
  m.def("sample_gaussian", &sample_gaussian, py::arg("mean"), py::arg("log_std"), py::arg("normals"),
        "(actions float32 [B, A], log-probabilities float32 [B]) of a Gaussian head: mean [B, A] + exp(log_std [A]) "
        "* normals [B, A] (float64 standard normal draws), the log-probability as torch's GaussianHead.log_prob.");
}

}  // namespace zrl::python
