// zrl._core.ServeLoop (csrc/server/serve_loop.h): the agent server's routine
// requests served in C++; zrl/server/fast_path.py is its Python face.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "python/bindings.h"
#include "python/numpy_args.h"
#include "server/serve_loop.h"

namespace py = pybind11;

namespace zrl::python {
namespace {

// A writable C-contiguous array of `dtype` with exactly `count` elements: one of a
// recorder's chunk arrays, which the loop writes rows into.
void* rows_of(const py::handle& obj, const py::dtype& dtype, py::ssize_t count, const char* name) {
  if (!py::isinstance<py::array>(obj)) throw py::value_error(std::string(name) + ": expected a numpy array");
  auto a = py::reinterpret_borrow<py::array>(obj);
  if (!a.dtype().equal(dtype) || a.size() != count || !(a.flags() & py::array::c_style) || !a.writeable())
    throw py::value_error(std::string(name) + ": expected a writable C-contiguous " +
                          py::str(dtype).cast<std::string>() + " array of " + std::to_string(count) + " elements");
  require_aligned(a, name);
  return a.mutable_data();
}

class PyServeLoop {
 public:
  PyServeLoop(const std::string& module, int major, int minor, int patch, uintptr_t socket, std::size_t obs_dim,
              std::size_t action_dim, uint64_t max_bytes, uint64_t seed)
      : obs_dim_(obs_dim), action_dim_(action_dim) {
    std::string why;
    const zrl::ZmqApi* api = zrl::ZmqApi::attach(module, major, minor, patch, &why);
    if (!api) throw std::runtime_error(why);
    if (!api->msg_more) throw std::runtime_error("libzmq without zmq_msg_more");
    loop_ = std::make_unique<zrl::ServeLoop>(api, reinterpret_cast<void*>(socket), obs_dim, action_dim, max_bytes, seed);
  }

  void add_act_layout(const py::bytes& block, uint64_t first, uint64_t end, uint64_t obs, uint64_t reward,
                        uint64_t flags) {
    loop_->add_act_layout(std::string(block), first, end, obs, reward, flags);
  }

  void set_action_template(const py::bytes& frame, uint64_t action_offset) {
    const std::string s(frame);
    loop_->set_action_template(std::vector<uint8_t>(s.begin(), s.end()), action_offset);
  }

  void set_policy(std::shared_ptr<zrl::MlpPolicy> policy, const py::object& log_std, uint64_t version) {
    std::vector<float> ls;
    if (!log_std.is_none()) {
      FloatArray a = as_float32(log_std, "log_std", 1);
      ls.assign(a.data(), a.data() + a.size());
    }
    loop_->set_policy(std::move(policy), std::move(ls), version);
  }

  // rows: (obs [T + 1, obs], action [T, (A)], reward [T], terminated [T], truncated [T], behaviour_logp [T]).
  void arm(int64_t id, const py::bytes& identity, const py::tuple& rows, int64_t t, int64_t steps,
           int64_t episode_length, double episode_return, double last_seen) {
    if (rows.size() != 6 || !py::isinstance<py::array>(rows[2])) throw py::value_error("rows: expected 6 arrays");
    auto f32 = py::dtype::of<float>();
    auto flag = py::dtype::of<bool>();
    const py::ssize_t T = py::reinterpret_borrow<py::array>(rows[2]).size();
    const py::ssize_t D = static_cast<py::ssize_t>(obs_dim_), A = static_cast<py::ssize_t>(action_dim_);
    zrl::ChunkRows c;
    c.T = T;
    c.obs = static_cast<float*>(rows_of(rows[0], f32, (T + 1) * D, "obs"));
    c.action = action_dim_ == 0 ? rows_of(rows[1], py::dtype::of<int64_t>(), T, "action")
                                : rows_of(rows[1], f32, T * A, "action");
    c.reward = static_cast<float*>(rows_of(rows[2], f32, T, "reward"));
    c.terminated = static_cast<uint8_t*>(rows_of(rows[3], flag, T, "terminated"));
    c.truncated = static_cast<uint8_t*>(rows_of(rows[4], flag, T, "truncated"));
    c.behaviour_logp = static_cast<float*>(rows_of(rows[5], f32, T, "behaviour_logp"));
    loop_->arm(id, std::string(identity), c, zrl::SessionState{t, steps, episode_length, episode_return, last_seen});
    keep_[id] = rows;  // the loop writes into them until take or forget
  }

  py::object take(int64_t id) {
    zrl::SessionState s;
    const bool held = loop_->take(id, &s);
    keep_.erase(id);
    if (!held) return py::none();
    return py::make_tuple(s.t, s.steps, s.episode_length, s.episode_return, s.last_seen);
  }

  void forget(int64_t id) {
    loop_->forget(id);
    keep_.erase(id);
  }

  py::tuple serve(int wait_ms, std::size_t max_batch, double budget_ms) {
    if (!loop_->ready()) throw std::logic_error("ServeLoop.serve: no policy, action template or ACT layout yet");
    std::vector<std::vector<zrl::ZmqMsg>> handback;
    std::vector<zrl::Completion> completed;
    zrl::ServeCounts counts;
    int err;
    {
      py::gil_scoped_release release;
      err = loop_->serve(wait_ms, max_batch, budget_ms, &handback, &completed, &counts);
    }
    const zrl::ZmqApi* api = loop_->api();
    // Every handed-back message is closed once, on the way out, whatever is raised below.
    struct CloseAll {
      const zrl::ZmqApi* api;
      std::vector<std::vector<zrl::ZmqMsg>>& messages;
      ~CloseAll() {
        for (auto& parts : messages)
          for (auto& m : parts) api->msg_close(&m);
      }
    } close_all{api, handback};
    py::list out(handback.size());
    for (std::size_t i = 0; i < handback.size(); ++i) {
      py::list parts(handback[i].size());
      for (std::size_t k = 0; k < handback[i].size(); ++k) {
        zrl::ZmqMsg& m = handback[i][k];
        parts[k] = py::bytes(static_cast<const char*>(api->msg_data(&m)), api->msg_size(&m));
      }
      out[i] = std::move(parts);
    }
    py::list done(completed.size());
    for (std::size_t i = 0; i < completed.size(); ++i) {
      const zrl::Completion& c = completed[i];
      py::object action;
      if (action_dim_ == 0) {
        action = py::int_(c.discrete);
      } else {
        py::array_t<float> a(static_cast<py::ssize_t>(c.continuous.size()));
        std::copy(c.continuous.begin(), c.continuous.end(), a.mutable_data());
        action = std::move(a);
      }
      done[i] = py::make_tuple(c.id, std::move(action), c.behaviour_logp);
    }
    if (err != 0 && handback.empty() && completed.empty()) {
      PyErr_SetObject(PyExc_OSError, py::make_tuple(err, api->strerror(err)).ptr());
      throw py::error_already_set();
    }
    return py::make_tuple(std::move(out), std::move(done), counts.requests, counts.batches, counts.reply_unread);
  }

  double last_seen(int64_t id) const { return loop_->last_seen(id); }
  bool armed(int64_t id) const { return loop_->armed(id); }

 private:
  std::size_t obs_dim_, action_dim_;
  std::unique_ptr<zrl::ServeLoop> loop_;
  std::unordered_map<int64_t, py::object> keep_;
};

}  // namespace

void bind_serve_loop(py::module_& m) {
  py::class_<PyServeLoop>(m, "ServeLoop",
                          "The agent server's routine ACTs served in C++ (csrc/server/serve_loop.h); "
                          "zrl.server.fast_path drives it.")
      .def(py::init<const std::string&, int, int, int, uintptr_t, std::size_t, std::size_t, uint64_t, uint64_t>(),
           py::arg("module"), py::arg("major"), py::arg("minor"), py::arg("patch"), py::arg("socket"),
           py::arg("obs_dim"), py::arg("action_dim"), py::arg("max_bytes"), py::arg("seed"))
      .def("add_act_layout", &PyServeLoop::add_act_layout, py::arg("block"), py::arg("first"), py::arg("end"),
           py::arg("obs"), py::arg("reward"), py::arg("flags"))
      .def("set_action_template", &PyServeLoop::set_action_template, py::arg("frame"), py::arg("action_offset"))
      .def("set_policy", &PyServeLoop::set_policy, py::arg("policy"), py::arg("log_std"), py::arg("version"))
      .def("arm", &PyServeLoop::arm, py::arg("id"), py::arg("identity"), py::arg("rows"), py::arg("t"),
           py::arg("steps"), py::arg("episode_length"), py::arg("episode_return"), py::arg("last_seen"))
      .def("take", &PyServeLoop::take, py::arg("id"),
           "The session's (t, steps, episode_length, episode_return, last_seen) if the loop held it; it no longer does.")
      .def("forget", &PyServeLoop::forget, py::arg("id"))
      .def("last_seen", &PyServeLoop::last_seen, py::arg("id"))
      .def("armed", &PyServeLoop::armed, py::arg("id"))
      .def("serve", &PyServeLoop::serve, py::arg("wait_ms"), py::arg("max_batch"), py::arg("budget_ms"),
           "Serves routine ACTs for up to budget_ms; returns (handed back [[identity, frame, ...], ...], "
           "completed chunks [(id, action, behaviour_logp), ...], answered, batches, reply_unread). Releases the GIL.");
}

}  // namespace zrl::python
