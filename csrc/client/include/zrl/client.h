// zrl::Client — lets a simulator written in C++ train through a zrl agent
// server (`zrl serve`): the simulator sends observations and rewards, the
// server answers with actions from the current policy and streams the
// experience to the learner. The calls mirror the Python client
// (zrl.client.Client) and RELAAX's agent protocol:
//
//   zrl::Client client("tcp://127.0.0.1:5557", zrl::ObsSpec{{4}},
//                      zrl::ActionSpec::discrete(2));
//   zrl::Action a = client.init(obs);          // FIRST: an episode starts
//   a = client.send(reward, obs);              // one step
//   double ret = client.reset(reward);         // LAST: the episode ended
//   client.reset(reward, /*truncated=*/true, final_obs);  // cut by a time limit
//   client.metrics().scalar("score", 42.0);    // -> TensorBoard custom/score
//
// The bytes on the wire are specified in docs/PROTOCOL.md ("Agent server");
// docs/CLIENT.md shows how to build, install and link this library.
//
// Depends on libzmq and the C++17 standard library only; this header
// includes neither ZeroMQ nor anything outside the standard library but
// <zrl/wire_format.h> (the format's constants, installed beside it).
//
// Threading contract. A Client is not thread-safe: it owns one ZeroMQ socket,
// and ZeroMQ sockets must not be used by two threads at once. Give each
// simulator thread its own Client (each is a separate session on the
// server). A Client may be created in one thread and used in another (or
// handed over between threads) as long as only one thread uses it at a time
// and the hand-over synchronises (std::thread start/join, a mutex, ...).
// Different Clients may be used concurrently without any locking; by default
// they share one process-wide ZeroMQ context, which is thread-safe.
//
// Error model. Every failure is a C++ exception deriving from zrl::Error
// (itself a std::runtime_error), so `catch (const zrl::Error&)` catches all:
//   UsageError     a wrong call: send() before init(), an observation of the
//                  wrong length or dtype, a bad spec or option. Thrown before
//                  anything is sent; the Client is unchanged and usable.
//   TimeoutError   no reply within ClientOptions::timeout. The Client closed
//                  its socket; the next call opens a fresh one and says hello
//                  again (the server may have restarted). The episode in
//                  progress is lost: the next call must be init().
//   ServerError    the server answered ERROR (spec mismatch in the hello, a
//                  request out of order, a session it dropped after its idle
//                  timeout, ...); server_message() is its text. The Client
//                  closed its socket, as after a timeout: the next call says
//                  hello again, and the episode in progress is over, so the
//                  next call must be init().
//   ProtocolError  the reply was malformed (bad frame, wrong kind, an action
//                  that does not fit the action spec). Handled as a timeout:
//                  socket closed, episode lost.
// Messages name the endpoint, the request and, for timeouts, the timeout.
//
// Timeouts. Each call that waits for the server (init, send, reset, and
// metrics().scalar the first time, which may need the hello) has one
// deadline, ClientOptions::timeout from the start of the call, covering the
// hello it may send first, queueing the request and receiving the reply.
//
// The hello is lazy: the constructor checks its arguments and connects the
// socket (ZeroMQ connects in the background, so no server needs to be up
// yet) but sends nothing; the first call says hello and waits for the reply.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "zrl/wire_format.h"

#if defined(_WIN32)
#define ZRL_CLIENT_API
#else
// The library is built with hidden visibility; this marks what it exports
// (the exception types included, so a catch in the application matches).
#define ZRL_CLIENT_API __attribute__((visibility("default")))
#endif

// The wire protocol version this client speaks (docs/PROTOCOL.md).
#define ZRL_CLIENT_PROTOCOL_VERSION ZRL_WIRE_PROTOCOL_VERSION

namespace zrl {

// ---------------------------------------------------------------------------
// Errors

class ZRL_CLIENT_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what);
  ~Error() override;
};

// A wrong call; nothing was sent.
class ZRL_CLIENT_API UsageError : public Error {
 public:
  explicit UsageError(const std::string& what);
  ~UsageError() override;
};

// No reply within the timeout; the socket was closed, the episode lost.
class ZRL_CLIENT_API TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& what);
  ~TimeoutError() override;
};

// The server answered ERROR; server_message() is its text, unchanged.
class ZRL_CLIENT_API ServerError : public Error {
 public:
  ServerError(const std::string& what, std::string server_message);
  ~ServerError() override;
  const std::string& server_message() const noexcept { return server_message_; }

 private:
  std::string server_message_;
};

// A malformed frame or reply. reason() is the receiver's reason code from
// docs/PROTOCOL.md ("bad_magic", "bad_length", "unexpected_kind", ...).
class ZRL_CLIENT_API ProtocolError : public Error {
 public:
  ProtocolError(const std::string& reason, const std::string& what);
  ~ProtocolError() override;
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::string reason_;
};

// ---------------------------------------------------------------------------
// Specs: what the simulator declares in the hello; the server checks them
// against its config.

// Observation dtypes a client may use on the wire.
enum class ObsDType : uint8_t { kFloat32, kUInt8 };

// "float32" or "uint8".
ZRL_CLIENT_API const char* obs_dtype_name(ObsDType dtype);

// The observation space, a box: shape (0 to 6 dims, each > 0) and dtype.
// low/high are optional scalar bounds sent in the hello (JSON null when
// unset), as zrl.spaces.BoxSpec has them; most configs leave them unset.
// An aggregate: zrl::ObsSpec{{84, 84, 4}, zrl::ObsDType::kUInt8}.
struct ZRL_CLIENT_API ObsSpec {
  std::vector<int64_t> shape;
  ObsDType dtype = ObsDType::kFloat32;
  std::optional<double> low = std::nullopt;
  std::optional<double> high = std::nullopt;

  // Product of the shape: the number of values in one observation.
  int64_t num_elements() const;
};

// The action space: discrete (one of n actions, 0..n-1) or a float32 box
// (needs an algorithm with a Gaussian policy on the server).
class ZRL_CLIENT_API ActionSpec {
 public:
  // n >= 1; throws UsageError otherwise.
  static ActionSpec discrete(int64_t n);
  // 0..6 dims, each > 0; low/high optional finite scalar bounds.
  static ActionSpec box(std::vector<int64_t> shape, std::optional<double> low = std::nullopt,
                        std::optional<double> high = std::nullopt);

  bool is_discrete() const noexcept { return discrete_; }
  int64_t n() const noexcept { return n_; }                             // 0 for a box
  const std::vector<int64_t>& shape() const noexcept { return shape_; }  // empty for discrete
  std::optional<double> low() const noexcept { return low_; }
  std::optional<double> high() const noexcept { return high_; }
  // Values in one action: 1 for discrete, the product of the shape for a box.
  int64_t num_elements() const;

 private:
  ActionSpec() = default;
  bool discrete_ = true;
  int64_t n_ = 0;
  std::vector<int64_t> shape_;
  std::optional<double> low_;
  std::optional<double> high_;
};

// ---------------------------------------------------------------------------
// Values

// An action chosen by the server: a discrete index, or the values of a box
// action (C order, the spec's shape). policy_version() is the version of the
// policy that chose it (0 for a default-constructed Action).
class ZRL_CLIENT_API Action {
 public:
  Action() = default;  // discrete, index 0
  static Action discrete(int64_t index, uint64_t policy_version = 0);
  static Action box(std::vector<float> values, uint64_t policy_version = 0);

  bool is_discrete() const noexcept { return discrete_; }
  // The discrete index; throws UsageError for a box action.
  int64_t index() const;
  // The box values; throws UsageError for a discrete action.
  const std::vector<float>& values() const;
  uint64_t policy_version() const noexcept { return policy_version_; }

 private:
  bool discrete_ = true;
  int64_t index_ = 0;
  std::vector<float> values_;
  uint64_t policy_version_ = 0;
};

// A non-owning view of one observation: pointer, number of values, dtype.
// Built implicitly from a std::vector<float> / std::vector<uint8_t>, or from
// a pointer and a length ({ptr, n}). The length is in values, not bytes, and
// must equal the spec's num_elements(); the dtype must be the spec's. A
// default-constructed view is "no observation" (only reset() accepts it).
// The memory must stay valid for the duration of the call only.
class ZRL_CLIENT_API ObsView {
 public:
  ObsView() = default;
  ObsView(const float* data, std::size_t size) : data_(data), size_(size), dtype_(ObsDType::kFloat32) {}
  ObsView(const uint8_t* data, std::size_t size) : data_(data), size_(size), dtype_(ObsDType::kUInt8) {}
  ObsView(const std::vector<float>& v) : ObsView(v.data(), v.size()) {}    // NOLINT: implicit on purpose
  ObsView(const std::vector<uint8_t>& v) : ObsView(v.data(), v.size()) {}  // NOLINT: implicit on purpose

  const void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  ObsDType dtype() const noexcept { return dtype_; }
  bool empty() const noexcept { return data_ == nullptr; }

 private:
  const void* data_ = nullptr;
  std::size_t size_ = 0;
  ObsDType dtype_ = ObsDType::kFloat32;
};

struct ZRL_CLIENT_API ClientOptions {
  // Deadline of each call, hello included (see "Timeouts" above). > 0; a longer
  // one than 100 years (milliseconds::max() for "no deadline") is taken as 100 years.
  std::chrono::milliseconds timeout{10000};
  // Sent in the hello; the server shows it in its logs. Any UTF-8.
  std::string name = "cpp";
  // CURVE encryption (libzmq built with libsodium: zmq_has("curve")). Z85
  // keys, 40 characters each: the server's public key, and this client's
  // public and secret keys. All three or none; empty means plain TCP.
  std::string curve_server_key;
  std::string curve_public_key;
  std::string curve_secret_key;
  // Sets the three keys from the files `zrl keys generate DIR` writes
  // (ZeroMQ's certificate format): the server's public key file
  // (DIR/server.key) and this client's secret key file (DIR/client.key_secret,
  // which holds its public key too). Throws UsageError if a file cannot be
  // read or lacks a key.
  void load_curve_keys(const std::string& server_public_file, const std::string& client_secret_file);
  // A libzmq context (void* from zmq_ctx_new(), or zmq::context_t::handle())
  // to open the socket in; it must outlive the Client. Needed for inproc://
  // endpoints, which only reach sockets of the same context. nullptr (the
  // default): one context shared by all Clients of the process.
  void* zmq_context = nullptr;
};

namespace detail {
class ClientImpl;
}

// Custom scalars for TensorBoard (custom/<name> on the learner).
class ZRL_CLIENT_API Metrics {
 public:
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Sends one STATS message, fire and forget: no reply is awaited. name is
  // 1..31 UTF-8 bytes without NUL and not one the server keeps for itself
  // (episode_return, episode_length, eval_return, eval_length); value is
  // finite; UsageError otherwise. Says hello first if no session is open
  // (and may then throw as init() does).
  void scalar(const std::string& name, double value);

 private:
  friend class detail::ClientImpl;
  explicit Metrics(detail::ClientImpl* impl) : impl_(impl) {}
  detail::ClientImpl* impl_;
};

class ZRL_CLIENT_API Client {
 public:
  // Checks the specs and options (UsageError; also for an endpoint libzmq
  // rejects, e.g. "tcp://nohost" without a port) and connects the socket.
  // Sends nothing: the hello goes out with the first call.
  Client(std::string endpoint, ObsSpec obs_spec, ActionSpec action_spec,
         ClientOptions options = {});
  // Sends BYE if a session is open (as disconnect()), never throws.
  ~Client();
  Client(Client&&) noexcept;
  Client& operator=(Client&&) noexcept;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Starts an episode (FIRST) with its first observation; returns the first
  // action. Allowed inside an episode: the unfinished one is dropped.
  Action init(ObsView obs);
  Action init(const float* obs, std::size_t size) { return init(ObsView(obs, size)); }
  Action init(const uint8_t* obs, std::size_t size) { return init(ObsView(obs, size)); }

  // One step: the reward for the previous action and the new observation;
  // returns the next action. UsageError outside an episode. Rewards (here
  // and in reset()) must be finite: the server refuses others, so the
  // client throws UsageError before sending.
  Action send(float reward, ObsView obs);
  Action send(float reward, const float* obs, std::size_t size) { return send(reward, ObsView(obs, size)); }
  Action send(float reward, const uint8_t* obs, std::size_t size) { return send(reward, ObsView(obs, size)); }

  // Ends the episode (LAST) with the reward for the last action; returns the
  // episode's total reward (the sum of the rewards given to send() and
  // reset() since init(), kept here, not asked of the server). The next
  // episode starts with init().
  //   reset(r)                        the environment ended it (terminated):
  //                                   no observation is sent (flags 2).
  //   reset(r, true, final_obs)       a time limit cut it (truncated): the
  //                                   final observation is required, the
  //                                   learner bootstraps from it (flags 6).
  // With truncated == false a given final_obs is not needed and not sent.
  double reset(float reward, bool truncated = false, ObsView final_obs = {});
  double reset(float reward, bool truncated, const float* final_obs, std::size_t size) {
    return reset(reward, truncated, ObsView(final_obs, size));
  }
  double reset(float reward, bool truncated, const uint8_t* final_obs, std::size_t size) {
    return reset(reward, truncated, ObsView(final_obs, size));
  }

  Metrics& metrics();

  // Sends BYE (if a session is open) and closes the socket, waiting at most
  // min(timeout, 1 s) for the BYE to leave. An episode in progress is
  // dropped. A later call opens a new session (a fresh socket and hello).
  void disconnect();

  const std::string& endpoint() const;
  const ObsSpec& obs_spec() const;
  const ActionSpec& action_spec() const;
  std::chrono::milliseconds timeout() const;
  bool in_episode() const;        // between a successful init() and reset()
  double episode_return() const;  // rewards summed since init()
  uint64_t policy_version() const;  // of the last reply (0 before any)

 private:
  std::unique_ptr<detail::ClientImpl> impl_;
};

// The library's version, "MAJOR.MINOR.PATCH".
ZRL_CLIENT_API const char* client_version();

}  // namespace zrl
