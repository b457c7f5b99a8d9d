// client_load — many concurrent client sessions from one process, the load
// that client_bench's one-process-per-client cannot reach (1,024 clients
// would be 1,024 processes on a machine of a few cores).
//
//   client_load --endpoint E --sessions N --steps S --warmup W --out FILE
//               [--mode zrl|raw] [--obs-dim D] [--actions A] [--timeout-ms T]
//               [--hello-rate R] [--step-hz H] [--allow-refused]
//
// Each session is a DEALER socket of its own (the server tells sessions apart
// by routing identity), and one thread drives all of them with zmq_poll.
// Sessions open at R per second (default 100), so that the hellos stay under
// the server's server.new_sessions_per_s instead of spending its burst.
// --mode zrl (default): each session speaks the wire as zrl::Client does,
//   through the client's own codec (csrc/client/wire.h, handshake.h): HELLO
//   with ObsSpec float32 [D] (default 4) and ActionSpec discrete(A) (default
//   2; both must match the server's config), ACT with FIRST, then plain ACT
//   steps, closed loop: a step is sent only once the previous reply is in (the
//   server ends a session that pipelines). Every 200 steps the episode ends
//   with a LAST request and the next starts with FIRST; those round trips are
//   neither timed nor counted as steps. At the end: LAST, then BYE.
// --mode raw: the reference. The same sockets and pacing, no hello: DEALER
//   round trips of a frame of exactly the ACT's size (see act_frame_bytes)
//   against E, a raw ZeroMQ echo ROUTER.
// --step-hz H paces each session as a simulator running at H steps per second:
// a step is sent at the session's next tick (ticks 1/H apart, the sessions'
// ticks spread over the period), or at once when the reply came after it. N
// sessions then offer N * H steps/s, and the latencies measure the service,
// not a queue that N closed loops would keep full (by Little's law, N closed
// loops at a rate X wait N / X each). 0 (the default): no pacing.
// Every session first does W untimed steps; the timed phase starts once all N
// sessions have opened and finished their warm-up (sessions that failed left
// out), so the timed numbers are of N sessions at once, not of a ramp. Then
// each session does S timed round trips.
//
// A hello answered with ERROR counts as refused, any other ERROR reply as an
// error; either ends that session and the others go on.
//
// Output FILE: one line per timed round trip of every session, in the order
// they completed, each the latency in microseconds with 3 decimals; no
// header, so numpy.loadtxt(FILE) reads it. Stdout: one summary line:
//   client_load mode=zrl sessions=N refused=.. errors=.. median_us=.. p99_us=..
//       wall_s=.. timed_s=.. steps_per_s=..
// timed_s is the timed phase's wall time (its start to the last timed reply),
// steps_per_s the timed round trips over timed_s.
// Exit status: 0 on success; 1 on any failure (a timeout included), or if a
// session was refused or got an ERROR, unless --allow-refused.
// Latencies come from std::chrono::steady_clock, from just before the send to
// just after the reply is read; with N sessions on one thread, that includes
// the wait for this thread to get round to the reply.
#include <zmq.h>
#include <zrl/client.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "handshake.h"
#include "wire.h"

#include "bench_common.h"

namespace {

using zrl::bench::act_frame_bytes;
using zrl::bench::micros;
using zrl::bench::percentile;

using Clock = std::chrono::steady_clock;

constexpr int64_t kEpisodeSteps = 200;  // as client_bench, so the two load the server alike

struct Args {
  std::string endpoint;
  int64_t sessions = 0;
  int64_t steps = 0;
  int64_t warmup = 0;
  std::string out;
  std::string mode = "zrl";
  int64_t obs_dim = 4;
  int64_t actions = 2;
  int64_t timeout_ms = 10000;
  double hello_rate = 100.0;
  double step_hz = 0.0;
  bool allow_refused = false;
};

[[noreturn]] void usage(const std::string& msg, int status = 1) {
  std::fprintf(stderr,
               "client_load: %s\n"
               "usage: client_load --endpoint E --sessions N --steps S --warmup W --out FILE\n"
               "                   [--mode zrl|raw] [--obs-dim D] [--actions A] [--timeout-ms T]\n"
               "                   [--hello-rate R] [--step-hz H] [--allow-refused]\n",
               msg.c_str());
  std::exit(status);
}

void check_args(const Args& a) {
  if (a.endpoint.empty() || a.out.empty()) usage("--endpoint and --out are required");
  if (a.sessions < 1 || a.steps < 1 || a.warmup < 0) usage("--sessions and --steps must be >= 1, --warmup >= 0");
  if (a.mode != "zrl" && a.mode != "raw") usage("--mode is zrl or raw");
  if (a.obs_dim < 1 || a.actions < 1 || a.timeout_ms < 1) usage("--obs-dim, --actions, --timeout-ms must be >= 1");
  if (!(a.hello_rate > 0)) usage("--hello-rate must be > 0");
  if (!(a.step_hz >= 0)) usage("--step-hz must be >= 0");
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") usage("times round trips of many concurrent sessions", 0);
    if (flag == "--allow-refused") {
      a.allow_refused = true;
      continue;
    }
    if (i + 1 >= argc) usage("missing value for " + flag);
    const char* v = argv[++i];
    if (flag == "--endpoint") a.endpoint = v;
    else if (flag == "--sessions") a.sessions = zrl::bench::number_arg<int64_t>(flag, v, usage);
    else if (flag == "--steps") a.steps = zrl::bench::number_arg<int64_t>(flag, v, usage);
    else if (flag == "--warmup") a.warmup = zrl::bench::number_arg<int64_t>(flag, v, usage);
    else if (flag == "--out") a.out = v;
    else if (flag == "--mode") a.mode = v;
    else if (flag == "--obs-dim") a.obs_dim = zrl::bench::number_arg<int64_t>(flag, v, usage);
    else if (flag == "--actions") a.actions = zrl::bench::number_arg<int64_t>(flag, v, usage);
    else if (flag == "--timeout-ms") a.timeout_ms = zrl::bench::number_arg<int64_t>(flag, v, usage);
    else if (flag == "--hello-rate") a.hello_rate = zrl::bench::number_arg<double>(flag, v, usage);
    else if (flag == "--step-hz") a.step_hz = zrl::bench::number_arg<double>(flag, v, usage);
    else usage("unknown option " + flag);
  }
  check_args(a);
  return a;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

enum class Pending { kNone, kHello, kFirst, kStep, kLast };

const char* pending_name(Pending p) {
  switch (p) {
    case Pending::kHello: return "HELLO";
    case Pending::kFirst: return "ACT FIRST";
    case Pending::kStep: return "ACT";
    case Pending::kLast: return "ACT LAST";
    case Pending::kNone: break;
  }
  return "nothing";
}

struct Session {
  void* sock = nullptr;
  Pending pending = Pending::kNone;  // the request whose reply it waits for
  uint64_t seq = 0;                  // that request's seq (zrl mode)
  Clock::time_point sent_at;
  int64_t steps = 0;       // plain steps done, warm-up and timed
  int64_t in_episode = 0;  // plain steps since the episode's FIRST
  bool episode_open = false;
  bool parked = false;  // warm-up done, waiting for the timed phase
  bool waiting = false;  // its next step waits for its tick (--step-hz)
  Clock::time_point tick;  // when its next step is due (--step-hz)
  bool over = false;    // finished or failed; its socket is closed
};

struct Totals {
  int64_t opened = 0, parked = 0, finished = 0, refused = 0, errors = 0;
  int64_t failed() const { return refused + errors; }
};

class Load {
 public:
  explicit Load(const Args& a);
  ~Load();
  void run();

  std::vector<double> latencies;  // us, one per timed round trip
  Totals totals;
  double timed_s = 0.0;

 private:
  void open_due(Clock::time_point now);
  void send_due(Clock::time_point now);
  void open_session(std::size_t i);
  void start_timing_if_ready();
  long poll_wait_ms(Clock::time_point now);
  void poll_once(Clock::time_point now);
  void drain(std::size_t i);
  void on_zrl_reply(std::size_t i, zmq_msg_t* msg);
  void on_step_done(std::size_t i);
  void advance(std::size_t i);
  void send(std::size_t i, Pending what);
  void encode(Session& s, Pending what);
  void fail(std::size_t i, bool refused, const std::string& why);
  void close(std::size_t i, bool bye);
  std::string who(std::size_t i) const;

  const Args& a_;
  const bool zrl_;
  void* ctx_ = nullptr;
  std::vector<Session> s_;
  std::string hello_meta_;
  zrl::wire::Shape obs_shape_;
  std::vector<float> obs_;
  std::vector<uint8_t> out_;  // the frame being sent: zmq_send copies it
  zrl::wire::Message reply_;
  std::vector<zmq_pollitem_t> items_;
  std::vector<std::size_t> item_session_;
  Clock::time_point start_, timed_start_, last_timed_;
  bool timing_ = false;
};

Load::Load(const Args& a)
    : a_(a), zrl_(a.mode == "zrl"), s_(static_cast<std::size_t>(a.sessions)),
      obs_(static_cast<std::size_t>(a.obs_dim), 0.0f) {
  ctx_ = zmq_ctx_new();
  // libzmq's default cap is 1,023 sockets per context; room for every session.
  if (zmq_ctx_set(ctx_, ZMQ_MAX_SOCKETS, static_cast<int>(a.sessions) + 16) != 0) {
    throw std::runtime_error(std::string("cannot raise ZMQ_MAX_SOCKETS: ") + zmq_strerror(zmq_errno()));
  }
  hello_meta_ = zrl::detail::hello_meta("client_load", zrl::ObsSpec{{a.obs_dim}}, zrl::ActionSpec::discrete(a.actions));
  obs_shape_ = zrl::wire::Shape::of({a.obs_dim});
  latencies.reserve(static_cast<std::size_t>(a.sessions * a.steps));
}

Load::~Load() {
  // Only a run cut short leaves sockets open, and nothing they hold matters then.
  const int zero = 0;
  for (std::size_t i = 0; i < s_.size(); ++i) {
    if (s_[i].sock == nullptr) continue;
    zmq_setsockopt(s_[i].sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_close(s_[i].sock);
  }
  zmq_ctx_term(ctx_);
}

std::string Load::who(std::size_t i) const { return "session " + std::to_string(i + 1) + " of " + std::to_string(s_.size()); }

void Load::run() {
  start_ = Clock::now();
  while (totals.finished + totals.failed() < a_.sessions) {
    const Clock::time_point now = Clock::now();
    open_due(now);
    start_timing_if_ready();
    send_due(now);
    poll_once(now);
  }
  if (timing_) timed_s = seconds(last_timed_ - timed_start_);
}

// Session i opens at i / R seconds after the start: a steady pace, not a burst.
void Load::open_due(Clock::time_point now) {
  while (totals.opened < a_.sessions) {
    const auto due = start_ + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(static_cast<double>(totals.opened) / a_.hello_rate));
    if (due > now) return;
    open_session(static_cast<std::size_t>(totals.opened++));
  }
}

// Sends the paced steps whose tick has come (--step-hz).
void Load::send_due(Clock::time_point now) {
  if (a_.step_hz <= 0) return;
  for (std::size_t i = 0; i < s_.size(); ++i) {
    if (s_[i].waiting && s_[i].tick <= now) {
      s_[i].waiting = false;
      s_[i].tick += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / a_.step_hz));
      send(i, Pending::kStep);
    }
  }
}

void Load::open_session(std::size_t i) {
  void* sock = zmq_socket(ctx_, ZMQ_DEALER);
  if (sock == nullptr) throw std::runtime_error(who(i) + ": cannot make a socket: " + zmq_strerror(zmq_errno()));
  s_[i].sock = sock;
  // A BYE still queued at the end may go; nothing else is worth waiting for.
  const int linger = 1000;
  zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
  if (zmq_connect(sock, a_.endpoint.c_str()) != 0) {
    throw std::runtime_error(who(i) + ": cannot connect to " + a_.endpoint + ": " + zmq_strerror(zmq_errno()));
  }
  if (zrl_) {
    send(i, Pending::kHello);
  } else {
    advance(i);
  }
}

void Load::start_timing_if_ready() {
  if (timing_ || totals.opened < a_.sessions) return;
  if (totals.parked == 0 || totals.parked < a_.sessions - totals.failed()) return;
  timing_ = true;
  timed_start_ = last_timed_ = Clock::now();
  for (std::size_t i = 0; i < s_.size(); ++i) {
    if (!s_[i].parked) continue;
    s_[i].parked = false;
    if (a_.step_hz > 0) {  // the ticks spread over one period, so the sessions do not step in lockstep
      s_[i].tick = timed_start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                     static_cast<double>(i) / static_cast<double>(s_.size()) / a_.step_hz));
    }
    advance(i);
  }
}

// Until the next session is due to open, or the earliest reply is overdue;
// a reply overdue now is a timeout, and ends the run.
long Load::poll_wait_ms(Clock::time_point now) {
  Clock::time_point until = now + std::chrono::milliseconds(100);
  if (totals.opened < a_.sessions) {
    until = std::min(until, start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                         static_cast<double>(totals.opened) / a_.hello_rate)));
  }
  for (const Session& s : s_) {
    if (s.waiting) until = std::min(until, s.tick);
  }
  const auto timeout = std::chrono::milliseconds(a_.timeout_ms);
  for (std::size_t i : item_session_) {
    const Clock::time_point deadline = s_[i].sent_at + timeout;
    if (now >= deadline) {
      throw std::runtime_error(who(i) + ": no reply to " + pending_name(s_[i].pending) + " (seq " +
                               std::to_string(s_[i].seq) + ") from " + a_.endpoint + " within " +
                               std::to_string(a_.timeout_ms) + " ms");
    }
    until = std::min(until, deadline);
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count();
  return std::max<long>(0, static_cast<long>(ms) + 1);
}

void Load::poll_once(Clock::time_point now) {
  items_.clear();
  item_session_.clear();
  for (std::size_t i = 0; i < s_.size(); ++i) {
    if (s_[i].pending == Pending::kNone) continue;
    items_.push_back(zmq_pollitem_t{s_[i].sock, 0, ZMQ_POLLIN, 0});
    item_session_.push_back(i);
  }
  const long wait_ms = poll_wait_ms(now);
  if (zmq_poll(items_.data(), static_cast<int>(items_.size()), wait_ms) < 0) {
    if (zmq_errno() == EINTR) return;
    throw std::runtime_error(std::string("zmq_poll failed: ") + zmq_strerror(zmq_errno()));
  }
  for (std::size_t k = 0; k < items_.size(); ++k) {
    if (items_[k].revents & ZMQ_POLLIN) drain(item_session_[k]);
  }
}

// Reads every message waiting on session i's socket.
void Load::drain(std::size_t i) {
  zmq_msg_t msg;
  zmq_msg_init(&msg);
  while (!s_[i].over && s_[i].pending != Pending::kNone) {
    if (zmq_msg_recv(&msg, s_[i].sock, ZMQ_DONTWAIT) < 0) {
      const int err = zmq_errno();
      if (err == EAGAIN) break;
      if (err == EINTR) continue;
      zmq_msg_close(&msg);
      throw std::runtime_error(who(i) + ": cannot receive: " + zmq_strerror(err));
    }
    if (zmq_msg_more(&msg)) {
      fail(i, false, "a reply of several frames; a zrl reply and an echo are one");
    } else if (zrl_) {
      on_zrl_reply(i, &msg);
    } else {
      on_step_done(i);
    }
  }
  zmq_msg_close(&msg);
}

void Load::on_zrl_reply(std::size_t i, zmq_msg_t* msg) {
  namespace wire = zrl::wire;
  Session& s = s_[i];
  try {
    wire::decode(zmq_msg_data(msg), zmq_msg_size(msg), &reply_);
  } catch (const zrl::ProtocolError& e) {
    fail(i, false, std::string("malformed reply to ") + pending_name(s.pending) + ": " + e.what());
    return;
  }
  const wire::Header& h = reply_.header;
  const bool error = h.kind == wire::Kind::kError;
  // As zrl::Client: a reply to another seq answers an earlier message; seq 0 is
  // an ERROR for a frame the server could not read.
  if (h.seq != s.seq && !(error && h.seq == 0)) return;
  const Pending was = s.pending;
  if (error) {
    fail(i, was == Pending::kHello, std::string(pending_name(was)) + " refused: " + std::string(reply_.meta));
    return;
  }
  const wire::Kind expected = was == Pending::kHello ? wire::Kind::kHelloReply : wire::Kind::kAction;
  if (h.kind != expected) {
    fail(i, false, std::string(wire::kind_name(h.kind)) + " in reply to " + pending_name(was));
    return;
  }
  s.pending = Pending::kNone;
  switch (was) {
    case Pending::kHello: send(i, Pending::kFirst); return;
    case Pending::kFirst: s.episode_open = true; s.in_episode = 0; advance(i); return;
    case Pending::kLast: s.episode_open = false; advance(i); return;
    default: on_step_done(i); return;
  }
}

void Load::on_step_done(std::size_t i) {
  Session& s = s_[i];
  const Clock::time_point now = Clock::now();
  if (timing_ && s.steps >= a_.warmup) {
    latencies.push_back(micros(now - s.sent_at));
    last_timed_ = now;
  }
  s.pending = Pending::kNone;
  ++s.steps;
  ++s.in_episode;
  advance(i);
}

// What session i sends next, now that it waits for nothing.
void Load::advance(std::size_t i) {
  Session& s = s_[i];
  const bool done = s.steps == a_.warmup + a_.steps;
  if (zrl_ && s.episode_open && (done || s.in_episode == kEpisodeSteps)) return send(i, Pending::kLast);
  if (done) {
    ++totals.finished;
    return close(i, zrl_);
  }
  if (zrl_ && !s.episode_open) return send(i, Pending::kFirst);
  if (!timing_ && s.steps == a_.warmup) {
    s.parked = true;
    ++totals.parked;
    return;
  }
  if (timing_ && a_.step_hz > 0) {
    const Clock::time_point now = Clock::now();
    const auto period = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / a_.step_hz));
    if (s.tick > now) {
      s.waiting = true;
      return;
    }
    s.tick = std::max(s.tick + period, now);  // (behind by a period or more: steps as replies come)
  }
  send(i, Pending::kStep);
}

void Load::encode(Session& s, Pending what) {
  namespace wire = zrl::wire;
  if (!zrl_) {
    out_.assign(act_frame_bytes(a_.obs_dim), 0);
    out_[0] = static_cast<uint8_t>(s.steps);
    return;
  }
  ++s.seq;
  if (what == Pending::kHello) return wire::encode_hello(s.seq, hello_meta_, &out_);
  if (what == Pending::kLast) return wire::encode_act(s.seq, wire::kFlagLast, 0.0f, nullptr, &out_);
  // The observation changes at every step, as a simulator's would.
  obs_[0] = static_cast<float>(s.steps % 1000) * 1e-3f;
  const wire::ArrayRef ref{"obs", wire::DType::kFloat32, obs_shape_, obs_.data()};
  wire::encode_act(s.seq, what == Pending::kFirst ? wire::kFlagFirst : 0, 0.0f, &ref, &out_);
}

void Load::send(std::size_t i, Pending what) {
  Session& s = s_[i];
  encode(s, what);
  s.pending = what;
  s.sent_at = Clock::now();
  // One request in flight per socket, far under its HWM: a send that would
  // block means something is badly wrong, so say so rather than wait.
  while (zmq_send(s.sock, out_.data(), out_.size(), ZMQ_DONTWAIT) < 0) {
    if (zmq_errno() == EINTR) continue;
    throw std::runtime_error(who(i) + ": cannot send " + pending_name(what) + ": " + zmq_strerror(zmq_errno()));
  }
}

void Load::fail(std::size_t i, bool refused, const std::string& why) {
  // The first of each kind is printed; the rest are only counted, as 1,024
  // sessions refused alike would say the same thing 1,024 times.
  int64_t& count = refused ? totals.refused : totals.errors;
  if (count++ == 0) std::fprintf(stderr, "client_load: %s: %s\n", who(i).c_str(), why.c_str());
  if (s_[i].parked) --totals.parked;
  close(i, false);
}

void Load::close(std::size_t i, bool bye) {
  Session& s = s_[i];
  if (bye) {
    zrl::wire::encode_bye(++s.seq, &out_);
    // Best effort, as zrl::Client's disconnect(): the server drops idle sessions anyway.
    zmq_send(s.sock, out_.data(), out_.size(), ZMQ_DONTWAIT);
  } else {
    const int zero = 0;
    zmq_setsockopt(s.sock, ZMQ_LINGER, &zero, sizeof(zero));
  }
  zmq_close(s.sock);
  s.sock = nullptr;
  s.pending = Pending::kNone;
  s.parked = false;
  s.over = true;
}

bool write_latencies(const std::string& path, const std::vector<double>& latencies) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "client_load: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  for (double us : latencies) std::fprintf(f, "%.3f\n", us);
  if (std::fclose(f) != 0) {
    std::fprintf(stderr, "client_load: cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

void print_summary(const Args& a, const Load& load, double wall_s) {
  std::vector<double> sorted = load.latencies;
  std::sort(sorted.begin(), sorted.end());
  const double rate = load.timed_s > 0 ? static_cast<double>(sorted.size()) / load.timed_s : 0.0;
  std::printf(
      "client_load mode=%s sessions=%lld refused=%lld errors=%lld median_us=%.2f p99_us=%.2f wall_s=%.3f "
      "timed_s=%.3f steps_per_s=%.0f\n",
      a.mode.c_str(), static_cast<long long>(a.sessions), static_cast<long long>(load.totals.refused),
      static_cast<long long>(load.totals.errors), percentile(sorted, 0.5), percentile(sorted, 0.99), wall_s,
      load.timed_s, rate);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse_args(argc, argv);
  const Clock::time_point start = Clock::now();
  try {
    Load load(a);
    load.run();
    const double wall_s = seconds(Clock::now() - start);
    if (!write_latencies(a.out, load.latencies)) return 1;
    print_summary(a, load, wall_s);
    if (load.totals.failed() > 0 && !a.allow_refused) {
      std::fprintf(stderr, "client_load: %lld session(s) refused, %lld failed with an ERROR (--allow-refused to accept)\n",
                   static_cast<long long>(load.totals.refused), static_cast<long long>(load.totals.errors));
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "client_load: %s\n", e.what());
    return 1;
  }
  return 0;
}
