#include "server/serve_loop.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "kernels/sample.h"
#include "zrl/wire_format.h"

namespace zrl {
namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A request has an identity and one frame; a longer one is kept to three parts (Python
// only needs to see that it is malformed) and the rest are read and dropped.
constexpr std::size_t kMaxKeptParts = 3;

}  // namespace

ServeLoop::ServeLoop(const ZmqApi* api, void* socket, std::size_t obs_dim, std::size_t action_dim,
                     uint64_t max_bytes, uint64_t seed)
    : api_(api), socket_(socket), obs_dim_(obs_dim), action_dim_(action_dim),
      gate_(static_cast<uint16_t>(wire::Kind::kAct), max_bytes), rng_(seed) {
  if (!api_ || !socket_) throw std::invalid_argument("ServeLoop: no libzmq or no socket");
  if (obs_dim_ == 0) throw std::invalid_argument("ServeLoop: obs_dim must be >= 1");
}

void ServeLoop::add_act_layout(const std::string& block, uint64_t first, uint64_t end, uint64_t obs,
                                 uint64_t reward, uint64_t flags) {
  const uint64_t obs_bytes = 4 * obs_dim_;
  if (obs < first || reward < first || flags < first || obs + obs_bytes > end || reward + 4 > end ||
      flags + 1 > end) {
    throw std::invalid_argument("add_act_layout: obs, reward or flags outside the arrays' span");
  }
  // Observations and the reward must be finite, as Python's check_finite requires.
  const std::vector<GateFinite> finite = {{obs, obs_dim_, 4}, {reward, 1, 4}};
  const int id = gate_.add(block, first, end, {}, {}, finite);
  if (static_cast<std::size_t>(id) >= layouts_.size()) layouts_.resize(static_cast<std::size_t>(id) + 1);
  layouts_[static_cast<std::size_t>(id)] = ActOffsets{obs, reward, flags};
}

void ServeLoop::set_action_template(std::vector<uint8_t> frame, uint64_t action_offset) {
  const uint64_t action_bytes = action_dim_ == 0 ? 8 : 4 * action_dim_;
  if (frame.size() < wire::kHeaderSize || action_offset + action_bytes > frame.size()) {
    throw std::invalid_argument("set_action_template: the action lies outside the frame");
  }
  template_ = std::move(frame);
  action_offset_ = action_offset;
}

void ServeLoop::set_policy(std::shared_ptr<MlpPolicy> policy, std::vector<float> log_std, uint64_t version) {
  if (!policy || policy->obs_dim() != obs_dim_) throw std::invalid_argument("set_policy: obs_dim differs");
  const std::size_t want = action_dim_ == 0 ? 0 : action_dim_;
  if (log_std.size() != want || (action_dim_ != 0 && policy->out_dim() != action_dim_)) {
    throw std::invalid_argument("set_policy: a Gaussian policy needs action_dim means and log_std; a discrete one neither");
  }
  policy_ = std::move(policy);
  log_std_ = std::move(log_std);
  version_ = version;
}

void ServeLoop::arm(int64_t id, const std::string& identity, const ChunkRows& rows, const SessionState& state) {
  if (rows.T < 1 || !rows.obs || !rows.action || !rows.reward || !rows.terminated || !rows.truncated ||
      !rows.behaviour_logp) {
    throw std::invalid_argument("arm: missing chunk rows");
  }
  if (state.t < 0 || state.t >= rows.T) throw std::invalid_argument("arm: t outside the chunk");
  auto [it, fresh] = sessions_.try_emplace(id);
  Session& s = it->second;
  if (!fresh && s.identity != identity) by_identity_.erase(s.identity);
  s.identity = identity;
  s.rows = rows;
  s.state = state;
  s.armed = s.held = true;
  s.in_batch = -1;
  by_identity_[identity] = id;
}

bool ServeLoop::take(int64_t id, SessionState* out) {
  auto it = sessions_.find(id);
  if (it == sessions_.end() || !it->second.held) return false;
  it->second.armed = it->second.held = false;
  *out = it->second.state;
  return true;
}

double ServeLoop::last_seen(int64_t id) const {
  auto it = sessions_.find(id);
  return it == sessions_.end() || !it->second.held ? -1.0 : it->second.state.last_seen;
}

bool ServeLoop::armed(int64_t id) const {
  auto it = sessions_.find(id);
  return it != sessions_.end() && it->second.armed;
}

void ServeLoop::forget(int64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  auto named = by_identity_.find(it->second.identity);
  if (named != by_identity_.end() && named->second == id) by_identity_.erase(named);
  sessions_.erase(it);
}

void ServeLoop::close_all(std::vector<ZmqMsg>* parts) {
  for (ZmqMsg& m : *parts) api_->msg_close(&m);
  parts->clear();
}

bool ServeLoop::receive(std::vector<ZmqMsg>* parts, int flags, int* err) {
  parts->clear();
  bool more = true;
  while (more) {
    ZmqMsg m;
    api_->msg_init(&m);
    int rc;
    do {  // (pyzmq retries an interrupted recv too)
      rc = api_->msg_recv(&m, socket_, parts->empty() ? flags : 0);
      *err = rc < 0 ? api_->errno_() : 0;
    } while (rc < 0 && *err == EINTR);
    if (rc < 0) {
      api_->msg_close(&m);
      close_all(parts);  // (a later part cannot fail to arrive: ZeroMQ delivers messages whole)
      return false;
    }
    more = api_->msg_more(&m) != 0;
    if (parts->size() < kMaxKeptParts) {
      parts->push_back(m);
    } else {
      api_->msg_close(&m);
    }
  }
  return true;
}

void ServeLoop::hand_back(Session* s, std::vector<Entry>* batch, std::vector<std::vector<ZmqMsg>>* handback) {
  s->armed = false;
  if (s->in_batch >= 0) {
    Entry& e = (*batch)[static_cast<std::size_t>(s->in_batch)];
    e.live = false;
    handback->push_back(std::move(e.parts));
    s->in_batch = -1;
  }
}

void ServeLoop::route(std::vector<ZmqMsg> parts, std::vector<Entry>* batch,
                      std::vector<std::vector<ZmqMsg>>* handback) {
  Session* s = nullptr;
  int64_t id = -1;
  if (!parts.empty()) {
    const std::string identity(static_cast<const char*>(api_->msg_data(&parts[0])), api_->msg_size(&parts[0]));
    auto named = by_identity_.find(identity);
    if (named != by_identity_.end()) {
      id = named->second;
      s = &sessions_.at(id);
    }
  }
  if (s && s->armed && s->in_batch < 0 && parts.size() == 2) {
    const auto* frame = static_cast<const uint8_t*>(api_->msg_data(&parts[1]));
    const GateResult g = gate_.check(frame, api_->msg_size(&parts[1]));
    if (g.layout >= 0 && static_cast<std::size_t>(g.layout) < layouts_.size() &&
        frame[layouts_[static_cast<std::size_t>(g.layout)].flags] == 0) {
      s->in_batch = static_cast<int64_t>(batch->size());
      batch->push_back(Entry{id, std::move(parts), g.layout, g.seq, true});
      return;
    }
  }
  if (s) hand_back(s, batch, handback);
  handback->push_back(std::move(parts));
}

double ServeLoop::normal() {
  // Box-Muller on two uniforms in (0, 1]: one draw per call, exact enough for a behaviour policy.
  const double u1 = 1.0 - rng_.uniform();
  const double u2 = rng_.uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

void ServeLoop::answer(std::vector<Entry>* batch, std::vector<std::vector<ZmqMsg>>* handback,
                       std::vector<Completion>* completed, ServeCounts* counts) {
  rows_.clear();
  for (std::size_t i = 0; i < batch->size(); ++i)
    if ((*batch)[i].live) rows_.push_back(i);
  const std::size_t n = rows_.size();
  if (n == 0) return;
  obs_.resize(n * obs_dim_);
  params_.resize(n * policy_->out_dim());
  for (std::size_t r = 0; r < n; ++r) {
    Entry& e = (*batch)[rows_[r]];
    const auto* frame = static_cast<const uint8_t*>(api_->msg_data(&e.parts[1]));
    std::memcpy(&obs_[r * obs_dim_], frame + layouts_[static_cast<std::size_t>(e.layout)].obs, 4 * obs_dim_);
  }
  policy_->forward(obs_.data(), n, params_.data());
  std::vector<bool> bad(n, false);
  draw(n, &bad);
  for (std::size_t r = 0; r < n; ++r) {
    Entry& e = (*batch)[rows_[r]];
    if (bad[r]) {  // logits that are not finite: Python refuses the request, as on its own path
      hand_back(&sessions_.at(e.id), batch, handback);
    } else {
      record_and_reply(e, r, completed, counts);
    }
  }
  counts->batches += 1;
}

void ServeLoop::draw(std::size_t n, std::vector<bool>* bad) {
  const std::size_t P = policy_->out_dim();
  logp_.resize(n);
  std::size_t done = 0;
  if (action_dim_ == 0) {
    draws_.resize(n);
    discrete_.resize(n);
    for (double& u : draws_) u = rng_.uniform();
    while (done < n) {
      const std::size_t k = sample_categorical(&params_[done * P], n - done, P, &draws_[done], &discrete_[done],
                                               &logp_[done]);
      if (k == n - done) break;
      (*bad)[done + k] = true;
      done += k + 1;
    }
    return;
  }
  draws_.resize(n * action_dim_);
  continuous_.resize(n * action_dim_);
  for (double& z : draws_) z = normal();
  while (done < n) {
    const std::size_t k = sample_gaussian(&params_[done * P], n - done, action_dim_, log_std_.data(),
                                          &draws_[done * action_dim_], &continuous_[done * action_dim_],
                                          &logp_[done]);
    if (k == n - done) break;
    (*bad)[done + k] = true;
    done += k + 1;
  }
}

void ServeLoop::record_and_reply(Entry& e, std::size_t row, std::vector<Completion>* completed,
                                 ServeCounts* counts) {
  Session& s = sessions_.at(e.id);
  s.in_batch = -1;
  const auto* frame = static_cast<const uint8_t*>(api_->msg_data(&e.parts[1]));
  float reward;
  std::memcpy(&reward, frame + layouts_[static_cast<std::size_t>(e.layout)].reward, 4);
  ChunkRows& c = s.rows;
  SessionState& st = s.state;
  int64_t t = st.t;
  // The step the ACT reports (the recorder's observe), then the action for the next one (its record).
  c.reward[t] = reward;
  c.terminated[t] = 0;
  c.truncated[t] = 0;
  std::memcpy(c.obs + static_cast<std::size_t>(t + 1) * obs_dim_, &obs_[row * obs_dim_], 4 * obs_dim_);
  st.t = ++t;
  st.steps += 1;
  st.episode_length += 1;
  st.episode_return += reward;
  st.last_seen = seconds_now();
  if (t == c.T) {  // the chunk is full: the action starts the next one, which Python begins
    Completion done{e.id, 0, {}, logp_[row]};
    if (action_dim_ == 0) {
      done.discrete = discrete_[row];
    } else {
      done.continuous.assign(&continuous_[row * action_dim_], &continuous_[(row + 1) * action_dim_]);
    }
    completed->push_back(std::move(done));
    s.armed = false;
  } else if (action_dim_ == 0) {
    static_cast<int64_t*>(c.action)[t] = discrete_[row];
    c.behaviour_logp[t] = logp_[row];
  } else {
    std::memcpy(static_cast<float*>(c.action) + static_cast<std::size_t>(t) * action_dim_,
                &continuous_[row * action_dim_], 4 * action_dim_);
    c.behaviour_logp[t] = logp_[row];
  }
  reply(e, row, counts);
}

void ServeLoop::reply(const Entry& e, std::size_t row, ServeCounts* counts) {
  reply_.assign(template_.begin(), template_.end());
  if (action_dim_ == 0) {
    wire::store_le<int64_t>(&reply_[action_offset_], discrete_[row]);
  } else {
    std::memcpy(&reply_[action_offset_], &continuous_[row * action_dim_], 4 * action_dim_);
  }
  stamp_header(reply_.data(), reply_.size(), e.seq, version_, reply_.size());
  counts->requests += 1;
  ZmqMsg& id = const_cast<ZmqMsg&>(e.parts[0]);  // (zmq_msg_data takes a non-const message)
  int err = send(*api_, socket_, api_->msg_data(&id), api_->msg_size(&id), kZmqSndMore | kZmqDontWait);
  if (err == 0) err = send(*api_, socket_, reply_.data(), reply_.size(), kZmqDontWait);
  // (A client that is gone, EHOSTUNREACH, is dropped by its timeout, as on Python's path.)
  if (err == EAGAIN) counts->reply_unread += 1;
}

int ServeLoop::serve(int wait_ms, std::size_t max_batch, double budget_ms,
                     std::vector<std::vector<ZmqMsg>>* handback, std::vector<Completion>* completed,
                     ServeCounts* counts) {
  const auto start = std::chrono::steady_clock::now();
  const auto budget = std::chrono::duration<double, std::milli>(budget_ms);
  std::vector<Entry> batch;
  std::vector<ZmqMsg> parts;
  int wait = wait_ms;
  while (true) {
    int err = 0;
    std::size_t got = 0;
    batch.clear();
    int saved_timeout = -1;
    std::size_t len = sizeof saved_timeout;
    const bool timed = wait != 0 && api_->getsockopt(socket_, kZmqRcvTimeo, &saved_timeout, &len) == 0 &&
                       api_->setsockopt(socket_, kZmqRcvTimeo, &wait, sizeof wait) == 0;
    // Everything queued is drained before any answer, even after a wait (unlike the learner's
    // drain): a client's second ACT sent right behind its first must meet it in one burst, where
    // the pipelining rule sees it, as on the Python path.
    while (got < max_batch) {
      const bool ok = receive(&parts, timed && got == 0 ? 0 : kZmqDontWait, &err);
      if (timed && got == 0) api_->setsockopt(socket_, kZmqRcvTimeo, &saved_timeout, sizeof saved_timeout);
      if (!ok) break;
      ++got;
      route(std::move(parts), &batch, handback);
      parts = {};
    }
    answer(&batch, handback, completed, counts);
    for (Entry& e : batch)
      if (e.live) close_all(&e.parts);
    if (err != 0 && err != EAGAIN) return err;
    const auto elapsed = std::chrono::steady_clock::now() - start;
    if (got == 0 || !handback->empty() || !completed->empty() || elapsed >= budget) return 0;
    wait = std::max(1, static_cast<int>(std::chrono::duration<double, std::milli>(budget - elapsed).count()));
  }
}

}  // namespace zrl
