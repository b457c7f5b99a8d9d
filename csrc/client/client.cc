// zrl::Client over one ZeroMQ DEALER socket, in the "lazy pirate" style of
// the ZeroMQ guide: every request waits for its reply with a deadline, and a
// request that gets no reply costs the socket. Closing it is the only way to
// drop what libzmq has queued for a dead peer; a fresh socket gets a fresh
// routing identity, so the server (perhaps restarted) sees a new session and
// the client says hello again before anything else. The server's episode
// state went with the old session, hence "episode lost: call init()". An
// ERROR or a malformed reply to a request costs the socket the same way: a
// server that forgot this session (its idle timeout, a restart) refuses every
// request from it until a new hello, so starting over is the one safe move.
//
// Replies are matched by seq: requests are numbered 1, 2, 3, ... over the
// Client's life (hello, ACT, STATS and BYE all take a number, so no two
// messages share one), and a reply with another seq is discarded: a late
// answer to an earlier request, or an ERROR the server sent for a STATS. An
// ERROR with seq 0 is the server's answer to a frame it could not read
// (it had no seq to echo), and is raised for the request being waited on.
#include "zrl/client.h"

#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>
#include <utility>

#include "handshake.h"
#include "wire.h"

namespace zrl {

Error::Error(const std::string& what) : std::runtime_error(what) {}
Error::~Error() = default;
UsageError::UsageError(const std::string& what) : Error(what) {}
UsageError::~UsageError() = default;
TimeoutError::TimeoutError(const std::string& what) : Error(what) {}
TimeoutError::~TimeoutError() = default;
ServerError::ServerError(const std::string& what, std::string server_message)
    : Error(what), server_message_(std::move(server_message)) {}
ServerError::~ServerError() = default;
ProtocolError::ProtocolError(const std::string& reason, const std::string& what) : Error(what), reason_(reason) {}
ProtocolError::~ProtocolError() = default;

const char* client_version() { return ZRL_CLIENT_VERSION; }

const char* obs_dtype_name(ObsDType dtype) { return dtype == ObsDType::kUInt8 ? "uint8" : "float32"; }

namespace {

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The wire allows 6 dims of uint32; the Python BoxSpec wants every dim > 0.
void check_box_shape(const char* what, const std::vector<int64_t>& shape) {
  if (shape.size() > wire::kMaxDims) {
    throw UsageError(std::string(what) + ": shape " + shape_str(shape) + " has more than " +
                     std::to_string(wire::kMaxDims) + " dims");
  }
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0 || d > int64_t{0xFFFFFFFF}) {
      throw UsageError(std::string(what) + ": shape " + shape_str(shape) + " must have dims in [1, 2^32)");
    }
    // A frame must fit in memory: 2^40 values is far beyond any real one.
    if (__builtin_mul_overflow(n, d, &n) || n > (int64_t{1} << 40)) {
      throw UsageError(std::string(what) + ": shape " + shape_str(shape) + " has too many elements");
    }
  }
}

void check_bound(const char* what, const std::optional<double>& bound) {
  if (bound && !std::isfinite(*bound)) throw UsageError(std::string(what) + ": low/high must be finite or unset");
}

}  // namespace

int64_t ObsSpec::num_elements() const { return product(shape); }

namespace {

// The value of `key = "..."` in a ZeroMQ certificate file (ZPL, as pyzmq's
// zmq.auth writes it: `    public-key = "Z85..."` under `curve`).
std::string certificate_key(const std::string& path, const std::string& key) {
  std::ifstream f(path);
  if (!f) throw UsageError("cannot read the CURVE key file " + path);
  std::string line;
  while (std::getline(f, line)) {
    const std::size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line.compare(start, key.size(), key) != 0) continue;
    const std::size_t eq = line.find('=', start + key.size());
    if (eq == std::string::npos) continue;
    std::string value = line.substr(eq + 1);
    const std::size_t a = value.find_first_not_of(" \t\"");
    const std::size_t b = value.find_last_not_of(" \t\r\"");
    value = a == std::string::npos ? "" : value.substr(a, b - a + 1);
    if (value.size() != 40) {
      throw UsageError("the CURVE key file " + path + ": " + key + " is not a 40-character Z85 key");
    }
    return value;
  }
  throw UsageError("the CURVE key file " + path + " has no " + key +
                   (key == "secret-key" ? " (give the client's .key_secret file)" : ""));
}

}  // namespace

void ClientOptions::load_curve_keys(const std::string& server_public_file, const std::string& client_secret_file) {
  curve_server_key = certificate_key(server_public_file, "public-key");
  curve_public_key = certificate_key(client_secret_file, "public-key");
  curve_secret_key = certificate_key(client_secret_file, "secret-key");
}

ActionSpec ActionSpec::discrete(int64_t n) {
  if (n < 1) throw UsageError("ActionSpec::discrete: n must be >= 1, got " + std::to_string(n));
  ActionSpec s;
  s.discrete_ = true;
  s.n_ = n;
  return s;
}

ActionSpec ActionSpec::box(std::vector<int64_t> shape, std::optional<double> low, std::optional<double> high) {
  check_box_shape("ActionSpec::box", shape);
  check_bound("ActionSpec::box", low);
  check_bound("ActionSpec::box", high);
  ActionSpec s;
  s.discrete_ = false;
  s.shape_ = std::move(shape);
  s.low_ = low;
  s.high_ = high;
  return s;
}

int64_t ActionSpec::num_elements() const { return discrete_ ? 1 : product(shape_); }

Action Action::discrete(int64_t index, uint64_t policy_version) {
  Action a;
  a.discrete_ = true;
  a.index_ = index;
  a.policy_version_ = policy_version;
  return a;
}

Action Action::box(std::vector<float> values, uint64_t policy_version) {
  Action a;
  a.discrete_ = false;
  a.values_ = std::move(values);
  a.policy_version_ = policy_version;
  return a;
}

int64_t Action::index() const {
  if (!discrete_) throw UsageError("Action::index() on a box action: use values()");
  return index_;
}

const std::vector<float>& Action::values() const {
  if (discrete_) throw UsageError("Action::values() on a discrete action: use index()");
  return values_;
}

namespace detail {
namespace {

using Clock = std::chrono::steady_clock;

// ClientOptions::timeout is clamped to this, so that now() + timeout fits the clock.
constexpr std::chrono::milliseconds kLongestTimeout = std::chrono::hours(24 * 365 * 100);

// One context for every Client that is not given one: a context per Client
// would cost an I/O thread each. It lives while some Client holds it; the
// last one to go terminates it, which waits for a pending BYE (bounded by
// that socket's linger).
std::shared_ptr<void> shared_context() {
  static std::mutex mu;
  static std::weak_ptr<void> weak;
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<void> ctx = weak.lock();
  if (!ctx) {
    void* raw = zmq_ctx_new();
    if (raw == nullptr) throw Error(std::string("zrl::Client: cannot create a ZeroMQ context: ") + zmq_strerror(errno));
    ctx = std::shared_ptr<void>(raw, [](void* c) { zmq_ctx_term(c); });
    weak = ctx;
  }
  return ctx;
}

// An owned libzmq socket handle.
class Socket {
 public:
  Socket() = default;
  explicit Socket(void* raw) : raw_(raw) {}
  Socket(Socket&& other) noexcept : raw_(std::exchange(other.raw_, nullptr)) {}
  Socket& operator=(Socket&& other) noexcept {
    if (this != &other) {
      close(0);
      raw_ = std::exchange(other.raw_, nullptr);
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { close(0); }

  void* get() const { return raw_; }
  explicit operator bool() const { return raw_ != nullptr; }

  // linger_ms: how long the context may keep trying to deliver what is queued.
  void close(int linger_ms) {
    if (raw_ == nullptr) return;
    zmq_setsockopt(raw_, ZMQ_LINGER, &linger_ms, sizeof(linger_ms));
    zmq_close(raw_);
    raw_ = nullptr;
  }

 private:
  void* raw_ = nullptr;
};

std::string errno_text() { return zmq_strerror(zmq_errno()); }

}  // namespace

class ClientImpl {
 public:
  ClientImpl(std::string endpoint, ObsSpec obs, ActionSpec action, ClientOptions options);
  ~ClientImpl();
  ClientImpl(const ClientImpl&) = delete;
  ClientImpl& operator=(const ClientImpl&) = delete;

  Action act(const char* call, uint8_t flags, float reward, const ObsView& obs);
  double reset(float reward, bool truncated, const ObsView& final_obs);
  void scalar(const std::string& name, double value);
  void disconnect();

  Metrics& metrics() { return metrics_; }
  const std::string& endpoint() const { return endpoint_; }
  const ObsSpec& obs_spec() const { return obs_; }
  const ActionSpec& action_spec() const { return action_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  bool in_episode() const { return in_episode_; }
  double episode_return() const { return episode_return_; }
  uint64_t policy_version() const { return policy_version_; }

 private:
  std::string prefix() const { return "zrl::Client(" + endpoint_ + ")"; }
  std::string timeout_text() const { return std::to_string(timeout_.count()) + " ms"; }
  void check_obs(const ObsView& obs, const char* call) const;
  void check_reward(float reward, const char* call) const;
  std::string no_episode_message(const char* call) const;

  void open_socket();
  // Closes the socket after a failed exchange; the next call starts over.
  void drop_session(const std::string& why);
  void ensure_session(Clock::time_point deadline, const char* call);
  bool wait_for(short events, Clock::time_point deadline);
  void send_frame(Clock::time_point deadline, const char* call, const char* kind, uint64_t seq);
  const wire::Message& await_reply(Clock::time_point deadline, const char* call, const char* kind, uint64_t seq);
  // Sends the ACT in out_ and returns its ACTION reply; ERROR -> ServerError.
  const wire::Message& exchange_act(Clock::time_point deadline, const char* call, uint64_t seq);
  [[noreturn]] void fail_protocol(const char* call, const std::string& reason, const std::string& detail);
  Action parse_action(const wire::Message& reply, const char* call);

  const std::string endpoint_;
  const ObsSpec obs_;
  const ActionSpec action_;
  const std::chrono::milliseconds timeout_;
  const ClientOptions options_;
  std::string hello_meta_;
  wire::Shape obs_shape_;
  wire::Shape action_shape_;
  std::size_t obs_elements_ = 0;

  std::shared_ptr<void> owned_ctx_;  // declared before socket_: destroyed after it
  void* ctx_ = nullptr;
  Socket socket_;
  bool session_ = false;  // the hello on this socket was answered
  bool in_episode_ = false;
  std::string lost_;  // why the last episode ended without reset(), for UsageError
  uint64_t next_seq_ = 1;
  double episode_return_ = 0.0;
  uint64_t policy_version_ = 0;

  std::vector<uint8_t> out_;  // the frame being sent; its capacity is reused
  zmq_msg_t in_;              // the last reply; reply_ views point into it
  wire::Message reply_;
  Metrics metrics_{this};
};

ClientImpl::ClientImpl(std::string endpoint, ObsSpec obs, ActionSpec action, ClientOptions options)
    : endpoint_(std::move(endpoint)),
      obs_(std::move(obs)),
      action_(std::move(action)),
      timeout_(std::min(options.timeout, kLongestTimeout)),
      options_(std::move(options)) {
  zmq_msg_init(&in_);
  if (endpoint_.empty()) throw UsageError("zrl::Client: the endpoint is empty (expected e.g. tcp://127.0.0.1:5557)");
  if (timeout_.count() <= 0) {
    throw UsageError(prefix() + ": the timeout must be > 0 ms, got " + timeout_text());
  }
  check_box_shape("ObsSpec", obs_.shape);
  check_bound("ObsSpec", obs_.low);
  check_bound("ObsSpec", obs_.high);
  obs_shape_ = wire::Shape::of(obs_.shape);
  action_shape_ = wire::Shape::of(action_.shape());
  obs_elements_ = static_cast<std::size_t>(obs_.num_elements());
  hello_meta_ = hello_meta(options_.name, obs_, action_);

  const int n_keys = !options_.curve_server_key.empty() + !options_.curve_public_key.empty() +
                     !options_.curve_secret_key.empty();
  if (n_keys != 0) {
    if (n_keys != 3) {
      throw UsageError(prefix() + ": CURVE needs all three keys (curve_server_key, curve_public_key, "
                                  "curve_secret_key), got " + std::to_string(n_keys));
    }
    if (!zmq_has("curve")) {
      throw UsageError(prefix() + ": CURVE keys given, but this libzmq has no CURVE support (built without libsodium)");
    }
    for (const std::string* key : {&options_.curve_server_key, &options_.curve_public_key, &options_.curve_secret_key}) {
      if (key->size() != 40) {
        throw UsageError(prefix() + ": CURVE keys are 40-character Z85 strings, got one of " +
                         std::to_string(key->size()) + " characters");
      }
    }
  }

  if (options_.zmq_context != nullptr) {
    ctx_ = options_.zmq_context;
  } else {
    owned_ctx_ = shared_context();
    ctx_ = owned_ctx_.get();
  }
  open_socket();  // a malformed endpoint fails here, not at the first step
}

ClientImpl::~ClientImpl() {
  try {
    disconnect();
  } catch (...) {  // a destructor must not throw; the socket is closed regardless
  }
  socket_.close(0);
  zmq_msg_close(&in_);
}

void ClientImpl::open_socket() {
  Socket s(zmq_socket(ctx_, ZMQ_DEALER));
  if (!s) throw Error(prefix() + ": cannot open a ZeroMQ socket: " + errno_text());
  const int zero = 0;
  zmq_setsockopt(s.get(), ZMQ_LINGER, &zero, sizeof(zero));
  // A larger reply is refused by decode anyway: libzmq drops it (and its peer) unread,
  // instead of buffering however much a broken or hostile server sends.
  const int64_t max_bytes = static_cast<int64_t>(wire::kDefaultMaxBytes);
  zmq_setsockopt(s.get(), ZMQ_MAXMSGSIZE, &max_bytes, sizeof(max_bytes));
  if (!options_.curve_server_key.empty()) {
    // Keys as Z85 text: libzmq decodes a 41-byte (NUL-terminated) value.
    const std::pair<int, const std::string*> keys[] = {{ZMQ_CURVE_SERVERKEY, &options_.curve_server_key},
                                                       {ZMQ_CURVE_PUBLICKEY, &options_.curve_public_key},
                                                       {ZMQ_CURVE_SECRETKEY, &options_.curve_secret_key}};
    for (const auto& [option, key] : keys) {
      if (zmq_setsockopt(s.get(), option, key->c_str(), key->size() + 1) != 0) {
        throw UsageError(prefix() + ": bad CURVE key: " + errno_text());
      }
    }
  }
  if (zmq_connect(s.get(), endpoint_.c_str()) != 0) {
    throw UsageError(prefix() + ": cannot connect: " + errno_text() +
                     " (endpoints look like tcp://HOST:PORT, ipc://PATH or inproc://NAME)");
  }
  socket_ = std::move(s);
  session_ = false;
}

void ClientImpl::drop_session(const std::string& why) {
  socket_.close(0);
  session_ = false;
  if (in_episode_) {
    in_episode_ = false;
    lost_ = why;
  }
}

std::string ClientImpl::no_episode_message(const char* call) const {
  if (!lost_.empty()) {
    return prefix() + ": " + call + " outside an episode: the last one was lost (" + lost_ +
           "); start a new one with init()";
  }
  return prefix() + ": " + call + " before init(): start an episode with init(obs) first";
}

void ClientImpl::check_obs(const ObsView& obs, const char* call) const {
  if (obs.empty()) throw UsageError(prefix() + ": " + call + ": no observation given");
  if (obs.dtype() != obs_.dtype) {
    throw UsageError(prefix() + ": " + call + ": the observation is " + obs_dtype_name(obs.dtype()) +
                     ", the ObsSpec says " + obs_dtype_name(obs_.dtype));
  }
  if (obs.size() != obs_elements_) {
    throw UsageError(prefix() + ": " + call + ": the observation has " + std::to_string(obs.size()) +
                     " values, the ObsSpec's shape " + shape_str(obs_.shape) + " needs " +
                     std::to_string(obs_elements_));
  }
}

bool ClientImpl::wait_for(short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = deadline - Clock::now();
    // Round up, so a wait never turns into a busy loop in its last millisecond.
    const auto ms = std::max<int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(left).count());
    zmq_pollitem_t item{socket_.get(), 0, events, 0};
    const int rc = zmq_poll(&item, 1, static_cast<long>(ms));
    if (rc < 0) {
      if (zmq_errno() == EINTR) continue;
      throw Error(prefix() + ": zmq_poll failed: " + errno_text());
    }
    // Ready, but past the deadline (a peer flooding stale replies): the call is over.
    if (Clock::now() >= deadline) return false;
    if (rc > 0) return true;
  }
}

void ClientImpl::send_frame(Clock::time_point deadline, const char* call, const char* kind, uint64_t seq) {
  for (;;) {
    if (zmq_send(socket_.get(), out_.data(), out_.size(), ZMQ_DONTWAIT) >= 0) return;
    const int err = zmq_errno();
    if (err == EINTR) continue;
    if (err != EAGAIN) throw Error(prefix() + ": cannot send " + kind + ": " + zmq_strerror(err));
    // The queue toward the server is full (it has been unreachable a while).
    if (!wait_for(ZMQ_POLLOUT, deadline)) {
      const std::string why = std::string(call) + " could not queue " + kind + " within " + timeout_text();
      drop_session(why);
      throw TimeoutError(prefix() + ": " + why + " (seq " + std::to_string(seq) +
                         "); closed the socket: the next call reconnects and says hello again");
    }
  }
}

void ClientImpl::fail_protocol(const char* call, const std::string& reason, const std::string& detail) {
  const std::string why = std::string("malformed reply to ") + call + ": " + detail;
  drop_session(why);
  throw ProtocolError(reason, prefix() + ": " + why + "; closed the socket: the next call reconnects");
}

const wire::Message& ClientImpl::await_reply(Clock::time_point deadline, const char* call, const char* kind,
                                             uint64_t seq) {
  for (;;) {
    if (!wait_for(ZMQ_POLLIN, deadline)) {
      const bool had_episode = in_episode_;
      const std::string why = "no reply to " + std::string(call) + " (" + kind + " seq " + std::to_string(seq) +
                              ") within " + timeout_text();
      drop_session(why);
      throw TimeoutError(prefix() + ": " + why +
                         ": the server is down, restarting or overloaded. Closed the socket: the next call "
                         "reconnects and says hello again" +
                         (had_episode ? "; the episode in progress is lost, start a new one with init()" : ""));
    }
    if (zmq_msg_recv(&in_, socket_.get(), ZMQ_DONTWAIT) < 0) {
      const int err = zmq_errno();
      if (err == EAGAIN || err == EINTR) continue;
      throw Error(prefix() + ": cannot receive: " + zmq_strerror(err));
    }
    if (zmq_msg_more(&in_)) {
      // A zrl reply is one frame; read the rest of this message to say how many.
      int parts = 1;
      while (zmq_msg_more(&in_) && zmq_msg_recv(&in_, socket_.get(), ZMQ_DONTWAIT) >= 0) ++parts;
      fail_protocol(call, "bad_header", "bad_header: a reply of " + std::to_string(parts) + " frames, expected 1");
    }
    try {
      wire::decode(zmq_msg_data(&in_), zmq_msg_size(&in_), &reply_);
    } catch (const ProtocolError& e) {
      fail_protocol(call, e.reason(), e.what());
    }
    const wire::Header& h = reply_.header;
    if (h.seq == seq || (h.kind == wire::Kind::kError && h.seq == 0)) return reply_;
    // Anything else answers an earlier message: drop it and keep waiting.
  }
}

void ClientImpl::ensure_session(Clock::time_point deadline, const char* call) {
  if (!socket_) open_socket();
  if (session_) return;
  const uint64_t seq = next_seq_++;
  wire::encode_hello(seq, hello_meta_, &out_);
  send_frame(deadline, call, "HELLO", seq);
  const wire::Message& reply = await_reply(deadline, call, "HELLO", seq);
  switch (reply.header.kind) {
    case wire::Kind::kHelloReply:
      session_ = true;
      policy_version_ = reply.header.policy_version;
      return;
    case wire::Kind::kError: {
      const std::string text(reply.meta);
      drop_session("the server refused the hello: " + text);
      throw ServerError(prefix() + ": the server refused the hello: " + text, text);
    }
    default:
      fail_protocol(call, "unexpected_kind",
                    std::string("unexpected_kind: ") + wire::kind_name(reply.header.kind) + " in reply to HELLO");
  }
}

const wire::Message& ClientImpl::exchange_act(Clock::time_point deadline, const char* call, uint64_t seq) {
  send_frame(deadline, call, "ACT", seq);
  const wire::Message& reply = await_reply(deadline, call, "ACT", seq);
  if (reply.header.kind == wire::Kind::kError) {
    // The server refused the step; whatever it held of the episode is gone.
    // The session goes too: a server that forgot it (its idle timeout, a
    // restart) refuses every request from this socket until a new hello, and
    // a fresh socket is a new session to any server.
    const std::string text(reply.meta);
    drop_session("the server refused " + std::string(call) + ": " + text);
    throw ServerError(prefix() + ": the server refused " + call + ": " + text +
                          " (closed the socket: the next call says hello again)",
                      text);
  }
  if (reply.header.kind != wire::Kind::kAction) {
    fail_protocol(call, "unexpected_kind",
                  std::string("unexpected_kind: ") + wire::kind_name(reply.header.kind) + " in reply to ACT");
  }
  policy_version_ = reply.header.policy_version;
  return reply;
}

Action ClientImpl::parse_action(const wire::Message& reply, const char* call) {
  if (reply.arrays.empty()) fail_protocol(call, "missing_field", "missing_field: ACTION without an action");
  if (reply.arrays.size() > 1 || reply.arrays[0].name != "action") {
    fail_protocol(call, "unknown_field", "unknown_field: ACTION carries arrays other than 'action'");
  }
  const wire::ArrayView& a = reply.arrays[0];
  const uint64_t version = reply.header.policy_version;
  if (action_.is_discrete()) {
    if (a.dtype != wire::DType::kInt64) {
      fail_protocol(call, "bad_dtype", std::string("bad_dtype: action is ") + wire::dtype_name(a.dtype) +
                                           ", a discrete action is int64");
    }
    if (a.shape.ndim != 0) fail_protocol(call, "bad_shape", "bad_shape: action shape " + a.shape.str() + ", expected ()");
    int64_t index;
    std::memcpy(&index, a.data, sizeof(index));
    if (index < 0 || index >= action_.n()) {
      fail_protocol(call, "bad_value", "bad_value: action " + std::to_string(index) + " outside [0, " +
                                           std::to_string(action_.n()) + ")");
    }
    return Action::discrete(index, version);
  }
  if (a.dtype != wire::DType::kFloat32) {
    fail_protocol(call, "bad_dtype", std::string("bad_dtype: action is ") + wire::dtype_name(a.dtype) +
                                         ", a box action is float32");
  }
  if (!(a.shape == action_shape_)) {
    fail_protocol(call, "bad_shape", "bad_shape: action shape " + a.shape.str() + ", expected " + action_shape_.str());
  }
  std::vector<float> values(a.shape.num_elements());
  if (!values.empty()) std::memcpy(values.data(), a.data, a.nbytes);
  return Action::box(std::move(values), version);
}

void ClientImpl::check_reward(float reward, const char* call) const {
  if (!std::isfinite(reward)) {
    throw UsageError(prefix() + ": " + call + ": the reward must be finite, got " + std::to_string(reward));
  }
}

Action ClientImpl::act(const char* call, uint8_t flags, float reward, const ObsView& obs) {
  const bool first = (flags & wire::kFlagFirst) != 0;
  if (!first && !in_episode_) throw UsageError(no_episode_message(call));
  check_reward(reward, call);
  check_obs(obs, call);
  const Clock::time_point deadline = Clock::now() + timeout_;
  ensure_session(deadline, call);
  const uint64_t seq = next_seq_++;
  const wire::ArrayRef ref{"obs", obs_.dtype == ObsDType::kUInt8 ? wire::DType::kUInt8 : wire::DType::kFloat32,
                           obs_shape_, obs.data()};
  wire::encode_act(seq, flags, reward, &ref, &out_);
  if (first && in_episode_) {
    // FIRST inside an episode drops the unfinished one (docs/PROTOCOL.md).
    in_episode_ = false;
  }
  const wire::Message& reply = exchange_act(deadline, call, seq);
  Action action = parse_action(reply, call);
  if (first) {
    in_episode_ = true;
    episode_return_ = 0.0;
    lost_.clear();
  } else {
    episode_return_ += reward;
  }
  return action;
}

double ClientImpl::reset(float reward, bool truncated, const ObsView& final_obs) {
  const char* call = truncated ? "reset(truncated)" : "reset()";
  if (!in_episode_) throw UsageError(no_episode_message(call));
  check_reward(reward, call);
  if (truncated) {
    if (final_obs.empty()) {
      throw UsageError(prefix() + ": reset(reward, truncated=true) needs the final observation: the learner "
                                  "bootstraps from it");
    }
    check_obs(final_obs, call);
  }
  const Clock::time_point deadline = Clock::now() + timeout_;
  ensure_session(deadline, call);
  const uint64_t seq = next_seq_++;
  if (truncated) {
    const wire::ArrayRef ref{"obs", obs_.dtype == ObsDType::kUInt8 ? wire::DType::kUInt8 : wire::DType::kFloat32,
                             obs_shape_, final_obs.data()};
    wire::encode_act(seq, wire::kFlagLast | wire::kFlagTruncated, reward, &ref, &out_);
  } else {
    wire::encode_act(seq, wire::kFlagLast, reward, nullptr, &out_);
  }
  const wire::Message& reply = exchange_act(deadline, call, seq);
  if (!reply.arrays.empty()) {
    fail_protocol(call, "unknown_field", "unknown_field: the reply to a LAST request carries arrays");
  }
  in_episode_ = false;
  lost_.clear();
  episode_return_ += reward;
  return episode_return_;
}

void ClientImpl::scalar(const std::string& name, double value) {
  if (name.empty() || name.size() >= wire::kNameBytes || name.find('\0') != std::string::npos ||
      !wire::is_valid_utf8(name)) {
    throw UsageError(prefix() + ": metrics().scalar: the name '" + name + "' must be 1.." +
                     std::to_string(wire::kNameBytes - 1) + " UTF-8 bytes without NUL");
  }
  // The server reports these itself and refuses them from clients; its
  // ERROR would answer a message that awaits no reply, so say it here.
  for (const char* reserved : {"episode_return", "episode_length", "eval_return", "eval_length"}) {
    if (name == reserved) {
      throw UsageError(prefix() + ": metrics().scalar: '" + name + "' is reserved for the server's own statistics");
    }
  }
  if (!std::isfinite(value)) {
    throw UsageError(prefix() + ": metrics().scalar(\"" + name + "\"): the value must be finite");
  }
  const Clock::time_point deadline = Clock::now() + timeout_;
  ensure_session(deadline, "metrics().scalar()");
  const uint64_t seq = next_seq_++;
  wire::encode_stats(seq, name, value, &out_);
  send_frame(deadline, "metrics().scalar()", "STATS", seq);
}

void ClientImpl::disconnect() {
  if (socket_ && session_) {
    wire::encode_bye(next_seq_++, &out_);
    // Best effort: a full queue means the server is gone, and it drops idle
    // sessions by itself anyway.
    zmq_send(socket_.get(), out_.data(), out_.size(), ZMQ_DONTWAIT);
    socket_.close(static_cast<int>(std::min<int64_t>(timeout_.count(), 1000)));
  } else {
    socket_.close(0);
  }
  session_ = false;
  if (in_episode_) {
    in_episode_ = false;
    lost_ = "disconnect() ended it";
  }
}

}  // namespace detail

void Metrics::scalar(const std::string& name, double value) { impl_->scalar(name, value); }

// ---------------------------------------------------------------------------
// Client: a thin handle, so the header needs neither ZeroMQ nor the wire.

namespace {
detail::ClientImpl& checked(const std::unique_ptr<detail::ClientImpl>& impl) {
  if (!impl) throw UsageError("zrl::Client used after it was moved from");
  return *impl;
}
}  // namespace

Client::Client(std::string endpoint, ObsSpec obs_spec, ActionSpec action_spec, ClientOptions options)
    : impl_(std::make_unique<detail::ClientImpl>(std::move(endpoint), std::move(obs_spec), std::move(action_spec),
                                                 std::move(options))) {}
Client::~Client() = default;
Client::Client(Client&&) noexcept = default;
Client& Client::operator=(Client&&) noexcept = default;

Action Client::init(ObsView obs) { return checked(impl_).act("init()", wire::kFlagFirst, 0.0f, obs); }
Action Client::send(float reward, ObsView obs) { return checked(impl_).act("send()", 0, reward, obs); }
double Client::reset(float reward, bool truncated, ObsView final_obs) {
  return checked(impl_).reset(reward, truncated, final_obs);
}
Metrics& Client::metrics() { return checked(impl_).metrics(); }
void Client::disconnect() { checked(impl_).disconnect(); }

const std::string& Client::endpoint() const { return checked(impl_).endpoint(); }
const ObsSpec& Client::obs_spec() const { return checked(impl_).obs_spec(); }
const ActionSpec& Client::action_spec() const { return checked(impl_).action_spec(); }
std::chrono::milliseconds Client::timeout() const { return checked(impl_).timeout(); }
bool Client::in_episode() const { return checked(impl_).in_episode(); }
double Client::episode_return() const { return checked(impl_).episode_return(); }
uint64_t Client::policy_version() const { return checked(impl_).policy_version(); }

}  // namespace zrl
