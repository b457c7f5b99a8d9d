// GoogleTest of zrl::Client against a scripted fake agent server: a ROUTER
// socket on tcp://127.0.0.1:* (a free port; inproc:// in one test) served by
// a std::thread. Each test's script decides the reply (or none) to every
// message the client sends; the server records what it got, so tests check
// the bytes and the order. Nothing sleeps: the tests wait on sockets and on a
// condition variable, always with a deadline.
#include <gtest/gtest.h>
#include <zmq.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "handshake.h"
#include "wire.h"
#include "zrl/client.h"

namespace {

namespace wire = zrl::wire;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// One message as the fake server received it.
struct Received {
  std::string identity;  // ZeroMQ routing identity: one per client socket
  std::vector<uint8_t> frame;
  wire::Kind kind = wire::Kind::kHello;
  uint64_t seq = 0;
  std::string meta;
  std::vector<std::string> names;  // array names, in order
  int flags = -1;                  // ACT
  float reward = NAN;              // ACT
  std::vector<uint8_t> obs;        // ACT: the obs array's bytes
  double stat = NAN;               // STATS: the first array's value
};

using Frames = std::vector<std::vector<uint8_t>>;
// Replies to the n-th message received (0-based), in order; empty: no reply.
using Script = std::function<Frames(const Received&, std::size_t n)>;

std::vector<uint8_t> frame(wire::Kind kind, uint64_t seq, uint64_t policy_version = 0,
                           std::vector<wire::ArrayRef> arrays = {}, std::string_view meta = {}) {
  std::vector<uint8_t> out;
  wire::encode(wire::Header{kind, 0, seq, policy_version}, arrays.data(), arrays.size(), meta, &out);
  return out;
}

std::vector<uint8_t> discrete_action(uint64_t seq, int64_t index, uint64_t policy_version = 7) {
  return frame(wire::Kind::kAction, seq, policy_version, {{"action", wire::DType::kInt64, wire::Shape{}, &index}});
}

std::vector<uint8_t> hello_reply(uint64_t seq, uint64_t policy_version = 7) {
  return frame(wire::Kind::kHelloReply, seq, policy_version, {}, R"({"ok":true,"client_id":1,"policy_version":7})");
}

std::vector<uint8_t> error_frame(uint64_t seq, const std::string& text) {
  return frame(wire::Kind::kError, seq, 0, {}, text);
}

// What a well-behaved server answers: hello -> HELLO_REPLY; ACT with an obs
// (FIRST or a step) -> ACTION with index seq % 2; a LAST -> an empty ACTION;
// STATS and BYE -> nothing. Every reply echoes the request's seq.
Frames well_behaved(const Received& r) {
  switch (r.kind) {
    case wire::Kind::kHello:
      return {hello_reply(r.seq)};
    case wire::Kind::kAct:
      if (r.flags & wire::kFlagLast) return {frame(wire::Kind::kAction, r.seq, 7)};
      return {discrete_action(r.seq, static_cast<int64_t>(r.seq % 2))};
    default:
      return {};
  }
}

class FakeServer {
 public:
  struct Options {
    std::string endpoint = "tcp://127.0.0.1:*";
    void* ctx = nullptr;  // nullptr: a context of its own
    std::string curve_secret_key;
  };

  explicit FakeServer(Script script) : FakeServer(std::move(script), Options()) {}
  FakeServer(Script script, Options options) : script_(std::move(script)) {
    own_ctx_ = options.ctx == nullptr;
    ctx_ = own_ctx_ ? zmq_ctx_new() : options.ctx;
    router_ = zmq_socket(ctx_, ZMQ_ROUTER);
    const int zero = 0;
    zmq_setsockopt(router_, ZMQ_LINGER, &zero, sizeof(zero));
    if (!options.curve_secret_key.empty()) {
      const int one = 1;
      zmq_setsockopt(router_, ZMQ_CURVE_SERVER, &one, sizeof(one));
      zmq_setsockopt(router_, ZMQ_CURVE_SECRETKEY, options.curve_secret_key.c_str(), 41);
    }
    if (zmq_bind(router_, options.endpoint.c_str()) != 0) {
      throw std::runtime_error("fake server cannot bind " + options.endpoint + ": " + zmq_strerror(zmq_errno()));
    }
    char last[256];
    std::size_t len = sizeof(last);
    zmq_getsockopt(router_, ZMQ_LAST_ENDPOINT, last, &len);
    endpoint_ = last;
    // A PAIR of inproc sockets wakes the server thread to stop.
    static std::atomic<int> counter{0};
    const std::string stop = "inproc://fake-server-stop-" + std::to_string(counter++);
    stop_rx_ = zmq_socket(ctx_, ZMQ_PAIR);
    stop_tx_ = zmq_socket(ctx_, ZMQ_PAIR);
    zmq_setsockopt(stop_rx_, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(stop_tx_, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_bind(stop_rx_, stop.c_str());
    zmq_connect(stop_tx_, stop.c_str());
    thread_ = std::thread([this] { run(); });
  }

  ~FakeServer() {
    zmq_send(stop_tx_, "x", 1, 0);
    thread_.join();
    zmq_close(router_);
    zmq_close(stop_rx_);
    zmq_close(stop_tx_);
    if (own_ctx_) zmq_ctx_term(ctx_);
  }

  const std::string& endpoint() const { return endpoint_; }

  // Waits (at most `within`) until n messages have arrived; returns them all.
  std::vector<Received> wait_for(std::size_t n, milliseconds within = milliseconds(5000)) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, within, [&] { return received_.size() >= n; })) {
      ADD_FAILURE() << "the fake server got " << received_.size() << " messages, expected " << n;
    }
    return received_;
  }

  std::vector<Received> received() {
    std::lock_guard<std::mutex> lock(mu_);
    return received_;
  }

 private:
  void run() {
    zmq_msg_t part;
    zmq_msg_init(&part);
    for (;;) {
      zmq_pollitem_t items[2] = {{router_, 0, ZMQ_POLLIN, 0}, {stop_rx_, 0, ZMQ_POLLIN, 0}};
      // Bounded even if a destructor never ran: no test takes 30 s.
      if (zmq_poll(items, 2, 30000) <= 0 || (items[1].revents & ZMQ_POLLIN)) break;
      std::vector<std::vector<uint8_t>> parts;
      do {
        zmq_msg_recv(&part, router_, 0);
        const auto* p = static_cast<const uint8_t*>(zmq_msg_data(&part));
        parts.emplace_back(p, p + zmq_msg_size(&part));
      } while (zmq_msg_more(&part));
      if (parts.size() != 2) {
        ADD_FAILURE() << "the client sent a message of " << parts.size() - 1 << " frames";
        continue;
      }
      Received r;
      r.identity.assign(parts[0].begin(), parts[0].end());
      r.frame = parts[1];
      wire::Message m;
      try {
        wire::decode(r.frame.data(), r.frame.size(), &m);
      } catch (const zrl::ProtocolError& e) {
        ADD_FAILURE() << "the client sent a bad frame: " << e.what();
        continue;
      }
      r.kind = m.header.kind;
      r.seq = m.header.seq;
      r.meta = std::string(m.meta);
      for (const wire::ArrayView& a : m.arrays) r.names.emplace_back(a.name);
      if (const wire::ArrayView* a = m.find("flags")) r.flags = *a->data;
      if (const wire::ArrayView* a = m.find("reward")) std::memcpy(&r.reward, a->data, 4);
      if (const wire::ArrayView* a = m.find("obs")) r.obs.assign(a->data, a->data + a->nbytes);
      if (r.kind == wire::Kind::kStats && !m.arrays.empty()) std::memcpy(&r.stat, m.arrays[0].data, 8);
      std::size_t n;
      {
        std::lock_guard<std::mutex> lock(mu_);
        n = received_.size();
        received_.push_back(r);
      }
      cv_.notify_all();
      for (const std::vector<uint8_t>& reply : script_(r, n)) {
        zmq_send(router_, r.identity.data(), r.identity.size(), ZMQ_SNDMORE);
        zmq_send(router_, reply.data(), reply.size(), 0);
      }
    }
    zmq_msg_close(&part);
  }

  Script script_;
  bool own_ctx_ = true;
  void* ctx_ = nullptr;
  void* router_ = nullptr;
  void* stop_rx_ = nullptr;
  void* stop_tx_ = nullptr;
  std::string endpoint_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Received> received_;
};

zrl::ClientOptions with_timeout(milliseconds t) {
  zrl::ClientOptions o;
  o.timeout = t;
  return o;
}

const zrl::ObsSpec kObs4{{4}};
const std::vector<float> kObsA = {0.1f, 0.2f, 0.3f, 0.4f};
const std::vector<float> kObsB = {1.0f, -1.0f, 0.5f, 0.0f};

std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<uint8_t> golden(const std::string& name) {
  std::ifstream f(std::string(ZRL_GOLDEN_DIR) + "/" + name + ".bin", std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// A frame with its seq field (header bytes 16..23) zeroed, to compare frames
// that differ only in numbering.
std::vector<uint8_t> without_seq(std::vector<uint8_t> f) {
  std::memset(f.data() + 16, 0, 8);
  return f;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ---------------------------------------------------------------------------

TEST(Client, InitSendResetRoundTripWithSeqEchoAndTotalReward) {
  FakeServer server([](const Received& r, std::size_t) { return well_behaved(r); });
  zrl::Client client(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2));
  EXPECT_FALSE(client.in_episode());

  zrl::Action a = client.init(kObsA);  // hello is seq 1, this ACT seq 2
  EXPECT_TRUE(a.is_discrete());
  EXPECT_EQ(a.index(), 0);
  EXPECT_EQ(a.policy_version(), 7u);
  EXPECT_TRUE(client.in_episode());
  a = client.send(1.0f, kObsB);  // seq 3
  EXPECT_EQ(a.index(), 1);
  a = client.send(2.5f, kObsA.data(), kObsA.size());  // seq 4
  EXPECT_EQ(a.index(), 0);
  EXPECT_DOUBLE_EQ(client.episode_return(), 3.5);
  EXPECT_DOUBLE_EQ(client.reset(0.5f), 4.0);  // seq 5
  EXPECT_FALSE(client.in_episode());
  EXPECT_EQ(client.policy_version(), 7u);

  // The next episode counts from zero.
  client.init(kObsB);
  EXPECT_DOUBLE_EQ(client.reset(-1.0f), -1.0);

  const std::vector<Received> got = server.received();
  ASSERT_EQ(got.size(), 7u);
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].seq, i + 1) << i;
  EXPECT_EQ(got[0].kind, wire::Kind::kHello);
  EXPECT_EQ(got[1].kind, wire::Kind::kAct);
  EXPECT_EQ(got[1].flags, 1);
  EXPECT_EQ(got[1].obs, bytes_of(kObsA));
  EXPECT_EQ(got[2].flags, 0);
  EXPECT_EQ(got[2].reward, 1.0f);
  EXPECT_EQ(got[2].obs, bytes_of(kObsB));
  EXPECT_EQ(got[3].reward, 2.5f);
  // A terminated episode sends no observation (flags 2).
  EXPECT_EQ(got[4].flags, 2);
  EXPECT_EQ(got[4].reward, 0.5f);
  EXPECT_EQ(got[4].names, (std::vector<std::string>{"reward", "flags"}));
  for (const Received& r : got) EXPECT_EQ(r.identity, got[0].identity);
}

TEST(Client, SendsTheDocumentedHelloAndGoldenActBytes) {
  FakeServer server([](const Received& r, std::size_t) { return well_behaved(r); });
  zrl::ClientOptions options;
  options.name = "golden";
  zrl::Client client(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2), options);
  client.init(kObsA);
  const std::vector<Received> got = server.received();
  ASSERT_EQ(got.size(), 2u);
  // Byte for byte the golden frames of docs/PROTOCOL.md, but for the seq.
  EXPECT_EQ(got[0].meta, R"({"role":"client","protocol":1,"name":"golden","obs_space":{"type":"box","shape":[4],"dtype":"float32","low":null,"high":null},"action_space":{"type":"discrete","n":2}})");
  EXPECT_EQ(without_seq(got[0].frame), without_seq(golden("client_hello")));
  EXPECT_EQ(without_seq(got[1].frame), without_seq(golden("act_first")));
}

TEST(Client, TruncatedResetSendsTheFinalObservationWithFlags6) {
  FakeServer server([](const Received& r, std::size_t) { return well_behaved(r); });
  zrl::Client client(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2));
  client.init(kObsA);
  client.send(1.0f, kObsA);
  EXPECT_DOUBLE_EQ(client.reset(1.0f, /*truncated=*/true, kObsB), 2.0);
  const std::vector<Received> got = server.received();
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[3].flags, 6);
  EXPECT_EQ(got[3].reward, 1.0f);
  EXPECT_EQ(got[3].obs, bytes_of(kObsB));
  EXPECT_EQ(without_seq(got[3].frame), without_seq(golden("act_last_truncated")));
}

TEST(Client, WrongCallsThrowUsageErrorBeforeAnythingIsSent) {
  FakeServer server([](const Received& r, std::size_t) { return well_behaved(r); });
  zrl::Client client(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2));
  const std::vector<float> three = {1, 2, 3};
  const std::vector<uint8_t> four_bytes = {1, 2, 3, 4};
  EXPECT_THROW(client.init(three), zrl::UsageError);
  EXPECT_THROW(client.init(four_bytes), zrl::UsageError);
  EXPECT_THROW(client.init(zrl::ObsView()), zrl::UsageError);
  try {
    client.send(1.0f, kObsA);
    ADD_FAILURE() << "send before init";
  } catch (const zrl::UsageError& e) {
    EXPECT_TRUE(contains(e.what(), "before init()")) << e.what();
    EXPECT_TRUE(contains(e.what(), server.endpoint())) << e.what();
  }
  EXPECT_THROW(client.reset(1.0f), zrl::UsageError);

  client.init(kObsA);
  EXPECT_THROW(client.send(1.0f, three), zrl::UsageError);
  EXPECT_THROW(client.reset(1.0f, true), zrl::UsageError);  // truncated needs the final obs
  EXPECT_THROW(client.reset(1.0f, true, three), zrl::UsageError);
  EXPECT_THROW(client.send(NAN, kObsA), zrl::UsageError);
  EXPECT_THROW(client.reset(INFINITY), zrl::UsageError);
  EXPECT_TRUE(client.in_episode());  // a refused call changes nothing
  EXPECT_DOUBLE_EQ(client.reset(1.0f), 1.0);

  // The server saw only the hello and the valid calls, numbered without gaps.
  const std::vector<Received> got = server.received();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].kind, wire::Kind::kHello);
  EXPECT_EQ(got[1].seq, 2u);
  EXPECT_EQ(got[1].flags, 1);
  EXPECT_EQ(got[2].seq, 3u);
  EXPECT_EQ(got[2].flags, 2);
}

TEST(Client, ServerErrorCarriesTheServersText) {
  FakeServer server([](const Received& r, std::size_t) -> Frames {
    if (r.kind == wire::Kind::kAct && r.flags == 0) return {error_frame(r.seq, "step before FIRST")};
    return well_behaved(r);
  });
  zrl::Client client(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2));
  client.init(kObsA);
  try {
    client.send(1.0f, kObsA);
    ADD_FAILURE() << "expected a ServerError";
  } catch (const zrl::ServerError& e) {
    EXPECT_EQ(e.server_message(), "step before FIRST");
    EXPECT_TRUE(contains(e.what(), "step before FIRST")) << e.what();
    EXPECT_TRUE(contains(e.what(), server.endpoint())) << e.what();
  }
  // The episode is over, and so is the session: init says hello again.
  EXPECT_FALSE(client.in_episode());
  try {
    client.send(1.0f, kObsA);
    ADD_FAILURE() << "expected a UsageError";
  } catch (const zrl::UsageError& e) {
    EXPECT_TRUE(contains(e.what(), "step before FIRST")) << e.what();
  }
  client.init(kObsA);
  const std::vector<Received> got = server.received();
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[3].kind, wire::Kind::kHello);
  EXPECT_NE(got[3].identity, got[0].identity);  // a fresh socket
  EXPECT_EQ(got[4].flags, 1);
}

TEST(Client, RefusedHelloIsAServerErrorAndTheNextCallSaysHelloAgain) {
  FakeServer server([](const Received& r, std::size_t n) -> Frames {
    if (r.kind == wire::Kind::kHello && n == 0) return {error_frame(r.seq, "observation spec differs")};
    return well_behaved(r);
  });
  zrl::Client client(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2));
  try {
    client.init(kObsA);
    ADD_FAILURE() << "expected a ServerError";
  } catch (const zrl::ServerError& e) {
    EXPECT_EQ(e.server_message(), "observation spec differs");
    EXPECT_TRUE(contains(e.what(), "refused the hello")) << e.what();
  }
  EXPECT_EQ(client.init(kObsA).index(), 1);  // hello seq 2, ACT seq 3
  const std::vector<Received> got = server.received();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[1].kind, wire::Kind::kHello);
  EXPECT_NE(got[1].identity, got[0].identity);  // a fresh socket
}

TEST(Client, ErrorWithSeqZeroIsRaisedForTheRequestInFlight) {
  FakeServer server([](const Received& r, std::size_t) -> Frames {
    if (r.kind == wire::Kind::kAct) return {error_frame(0, "bad frame")};
    return well_behaved(r);
  });
  zrl::Client client(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2));
  EXPECT_THROW(client.init(kObsA), zrl::ServerError);
}

TEST(Client, RepliesWithAnotherSeqAreDiscarded) {
  FakeServer server([](const Received& r, std::size_t) -> Frames {
    if (r.kind == wire::Kind::kAct && !(r.flags & wire::kFlagLast)) {
      // A late reply to an earlier request, an ERROR answering some STATS,
      // then the real answer.
      return {discrete_action(r.seq - 1, 1), error_frame(r.seq + 100, "about a STATS"), discrete_action(r.seq, 0)};
    }
    return well_behaved(r);
  });
  zrl::Client client(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2));
  EXPECT_EQ(client.init(kObsA).index(), 0);
  EXPECT_EQ(client.send(1.0f, kObsA).index(), 0);
  EXPECT_EQ(client.send(1.0f, kObsA).index(), 0);
  EXPECT_DOUBLE_EQ(client.reset(1.0f), 3.0);
}

// A bare ROUTER on a port the OS picks, for servers FakeServer's scripts cannot play
// (a reply of two frames, an endless flood); closed, with its context, when it goes.
struct RawRouter {
  void* ctx = zmq_ctx_new();
  void* sock = zmq_socket(ctx, ZMQ_ROUTER);
  std::string endpoint;
  RawRouter() {
    const int zero = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_bind(sock, "tcp://127.0.0.1:*") != 0) throw std::runtime_error("RawRouter: cannot bind");
    char last[256];
    std::size_t len = sizeof(last);
    zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, last, &len);
    endpoint = last;
  }
  ~RawRouter() {
    zmq_close(sock);
    zmq_ctx_term(ctx);
  }
};

TEST(Client, AFloodOfStaleRepliesDoesNotHoldACallPastItsDeadline) {
  // A server that answers the hello with replies to other requests, without end: each is
  // discarded, and the call must still end at its deadline (it used to wait for a pause).
  RawRouter raw;
  void* router = raw.sock;
  std::atomic<bool> stop{false};
  std::thread flood([&] {
    char identity[256];
    const int n = zmq_recv(router, identity, sizeof(identity), 0);  // the hello's routing identity
    zmq_msg_t rest;
    zmq_msg_init(&rest);
    while (zmq_msg_recv(&rest, router, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&rest)) {
    }
    zmq_msg_close(&rest);
    // 64 arrays: a reply the client takes longer to decode than the flood takes to send.
    static const int64_t zeros[64] = {};
    std::vector<wire::ArrayRef> arrays;
    std::vector<std::string> names;
    for (int i = 0; i < 64; ++i) names.push_back("a" + std::to_string(i));
    for (int i = 0; i < 64; ++i) arrays.push_back({names[i], wire::DType::kInt64, wire::Shape{}, &zeros[i]});
    const std::vector<uint8_t> stale = frame(wire::Kind::kAction, 999, 7, arrays);
    const Clock::time_point until = Clock::now() + milliseconds(20000);
    while (!stop && Clock::now() < until) {
      zmq_send(router, identity, static_cast<std::size_t>(n), ZMQ_SNDMORE);
      zmq_send(router, stale.data(), stale.size(), 0);
    }
  });
  zrl::Client client(raw.endpoint, kObs4, zrl::ActionSpec::discrete(2), with_timeout(milliseconds(200)));
  const Clock::time_point t0 = Clock::now();
  EXPECT_THROW(client.init(kObsA), zrl::TimeoutError);
  const double waited = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  stop = true;
  flood.join();
  EXPECT_GE(waited, 190.0);
  EXPECT_LT(waited, 5000.0);  // not the flood's 20 s
}

TEST(Client, TimeoutClosesTheSocketAndTheNextCallReconnectsAndSaysHelloAgain) {
  // The server ignores the first step (seq 3): the client must give up.
  FakeServer server([](const Received& r, std::size_t) -> Frames {
    if (r.kind == wire::Kind::kAct && r.seq == 3) return {};
    return well_behaved(r);
  });
  zrl::Client client(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2), with_timeout(milliseconds(200)));
  client.init(kObsA);
  const Clock::time_point t0 = Clock::now();
  try {
    client.send(1.0f, kObsA);
    ADD_FAILURE() << "expected a TimeoutError";
  } catch (const zrl::TimeoutError& e) {
    EXPECT_TRUE(contains(e.what(), server.endpoint())) << e.what();
    EXPECT_TRUE(contains(e.what(), "200 ms")) << e.what();
    EXPECT_TRUE(contains(e.what(), "init()")) << e.what();
  }
  const double waited = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  EXPECT_GE(waited, 190.0);
  EXPECT_LT(waited, 3000.0);
  EXPECT_FALSE(client.in_episode());

  // The episode is lost: only init() may follow.
  try {
    client.send(1.0f, kObsA);
    ADD_FAILURE() << "expected a UsageError";
  } catch (const zrl::UsageError& e) {
    EXPECT_TRUE(contains(e.what(), "lost")) << e.what();
  }
  EXPECT_THROW(client.reset(1.0f), zrl::UsageError);

  EXPECT_EQ(client.init(kObsB).index(), 1);  // hello seq 4, ACT seq 5
  EXPECT_EQ(client.send(1.0f, kObsB).index(), 0);
  const std::vector<Received> got = server.received();
  ASSERT_EQ(got.size(), 6u);
  EXPECT_EQ(got[3].kind, wire::Kind::kHello);
  EXPECT_EQ(got[3].seq, 4u);
  EXPECT_NE(got[3].identity, got[0].identity);
  EXPECT_EQ(got[4].identity, got[3].identity);
  EXPECT_EQ(got[4].flags, 1);
}

TEST(Client, NoServerAtAllTimesOutOnTheHello) {
  // Bind and close a socket to get a port nobody listens on.
  std::string endpoint;
  { endpoint = FakeServer([](const Received&, std::size_t) { return Frames{}; }).endpoint(); }
  zrl::Client client(endpoint, kObs4, zrl::ActionSpec::discrete(2), with_timeout(milliseconds(100)));
  try {
    client.init(kObsA);
    ADD_FAILURE() << "expected a TimeoutError";
  } catch (const zrl::TimeoutError& e) {
    EXPECT_TRUE(contains(e.what(), "HELLO")) << e.what();
    EXPECT_TRUE(contains(e.what(), "100 ms")) << e.what();
  }
  EXPECT_THROW(client.init(kObsA), zrl::TimeoutError);  // and again, on a fresh socket
}

TEST(Client, MalformedRepliesAreProtocolErrorsAndCostTheSession) {
  struct Case {
    const char* what;
    std::function<std::vector<uint8_t>(uint64_t seq)> reply;
    const char* reason;
  };
  const std::vector<Case> cases = {
      {"garbage", [](uint64_t) { return std::vector<uint8_t>(64, 0xAB); }, "bad_magic"},
      {"truncated", [](uint64_t seq) { auto f = discrete_action(seq, 1); f.pop_back(); return f; }, "bad_length"},
      {"an ack for a step", [](uint64_t seq) { return frame(wire::Kind::kAction, seq); }, "missing_field"},
      {"float action for discrete", [](uint64_t seq) {
         const float x = 1;
         return frame(wire::Kind::kAction, seq, 0, {{"action", wire::DType::kFloat32, wire::Shape{}, &x}});
       }, "bad_dtype"},
      {"action out of range", [](uint64_t seq) { return discrete_action(seq, 2); }, "bad_value"},
      {"extra array", [](uint64_t seq) {
         const int64_t x = 0;
         return frame(wire::Kind::kAction, seq, 0,
                      {{"action", wire::DType::kInt64, wire::Shape{}, &x}, {"junk", wire::DType::kInt64, wire::Shape{}, &x}});
       }, "unknown_field"},
      {"wrong kind", [](uint64_t seq) { return hello_reply(seq); }, "unexpected_kind"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    FakeServer server([&c](const Received& r, std::size_t n) -> Frames {
      if (r.kind == wire::Kind::kAct && n == 1) return {c.reply(r.seq)};
      return well_behaved(r);
    });
    zrl::Client client(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2));
    try {
      client.init(kObsA);
      ADD_FAILURE() << "expected a ProtocolError";
    } catch (const zrl::ProtocolError& e) {
      EXPECT_EQ(e.reason(), c.reason) << e.what();
      EXPECT_TRUE(contains(e.what(), server.endpoint())) << e.what();
    }
    client.init(kObsA);  // a fresh socket and hello
    const std::vector<Received> got = server.received();
    ASSERT_EQ(got.size(), 4u);
    EXPECT_EQ(got[2].kind, wire::Kind::kHello);
    EXPECT_NE(got[2].identity, got[0].identity);
  }
}

TEST(Client, AReplyOfTwoFramesIsRejected) {
  // A zrl reply is one frame. This server answers the hello REQ-style, with an
  // empty delimiter frame first, which FakeServer's scripts cannot do.
  RawRouter raw;
  void* router = raw.sock;
  std::thread serve([router] {
    zmq_pollitem_t item{router, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 5000) <= 0) return;
    char identity[256];
    const int n = zmq_recv(router, identity, sizeof(identity), 0);
    std::vector<uint8_t> hello(4096);
    const int size = zmq_recv(router, hello.data(), hello.size(), 0);
    wire::Message m;
    wire::decode(hello.data(), static_cast<std::size_t>(size), &m);
    const std::vector<uint8_t> reply = hello_reply(m.header.seq);
    zmq_send(router, identity, static_cast<std::size_t>(n), ZMQ_SNDMORE);
    zmq_send(router, "", 0, ZMQ_SNDMORE);
    zmq_send(router, reply.data(), reply.size(), 0);
  });
  zrl::Client client(raw.endpoint, kObs4, zrl::ActionSpec::discrete(2), with_timeout(milliseconds(5000)));
  try {
    client.init(kObsA);
    ADD_FAILURE() << "expected a ProtocolError";
  } catch (const zrl::ProtocolError& e) {
    EXPECT_EQ(e.reason(), "bad_header") << e.what();
  }
  serve.join();
}

TEST(Client, BoxActionsAndUint8Observations) {
  FakeServer server([](const Received& r, std::size_t) -> Frames {
    if (r.kind == wire::Kind::kAct && !(r.flags & wire::kFlagLast)) {
      const float values[2] = {0.5f, -0.25f};
      return {frame(wire::Kind::kAction, r.seq, 12, {{"action", wire::DType::kFloat32, wire::Shape::of({2}), values}})};
    }
    return well_behaved(r);
  });
  zrl::Client client(server.endpoint(), zrl::ObsSpec{{3, 4}, zrl::ObsDType::kUInt8},
                     zrl::ActionSpec::box({2}, -1.0, 1.0));
  std::vector<uint8_t> pixels(12);
  for (int i = 0; i < 12; ++i) pixels[i] = static_cast<uint8_t>(i);
  const zrl::Action a = client.init(pixels);
  EXPECT_FALSE(a.is_discrete());
  EXPECT_EQ(a.values(), (std::vector<float>{0.5f, -0.25f}));
  EXPECT_EQ(a.policy_version(), 12u);
  EXPECT_THROW(a.index(), zrl::UsageError);
  EXPECT_THROW(client.send(0.0f, std::vector<float>(12)), zrl::UsageError);  // float32 for a uint8 spec
  client.send(1.5f, pixels.data(), pixels.size());
  EXPECT_DOUBLE_EQ(client.reset(0.0f, true, pixels), 1.5);
  const std::vector<Received> got = server.received();
  ASSERT_EQ(got.size(), 4u);
  EXPECT_TRUE(contains(got[0].meta, R"("action_space":{"type":"box","shape":[2],"dtype":"float32","low":-1.0,"high":1.0})"))
      << got[0].meta;
  EXPECT_EQ(got[2].obs, pixels);
  EXPECT_EQ(without_seq(got[2].frame), without_seq(golden("act_step_uint8")));
  EXPECT_EQ(got[3].flags, 6);
}

TEST(Client, MetricsScalarSendsStatsWithoutWaitingForAReply) {
  FakeServer server([](const Received& r, std::size_t) { return well_behaved(r); });
  zrl::Client client(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2));
  client.metrics().scalar("score", 42.0);  // says hello first
  std::vector<Received> got = server.wait_for(2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].kind, wire::Kind::kHello);
  EXPECT_EQ(got[1].kind, wire::Kind::kStats);
  EXPECT_EQ(got[1].seq, 2u);
  EXPECT_EQ(got[1].names, std::vector<std::string>{"score"});
  EXPECT_EQ(got[1].stat, 42.0);
  EXPECT_EQ(without_seq(got[1].frame), without_seq(golden("client_stats")));

  EXPECT_THROW(client.metrics().scalar("", 1.0), zrl::UsageError);
  EXPECT_THROW(client.metrics().scalar(std::string(32, 'x'), 1.0), zrl::UsageError);
  EXPECT_THROW(client.metrics().scalar("nan", NAN), zrl::UsageError);
  EXPECT_THROW(client.metrics().scalar("episode_return", 1.0), zrl::UsageError);  // the server's own
  client.init(kObsA);  // the next request gets seq 3
  got = server.received();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[2].seq, 3u);
}

TEST(Client, DisconnectSendsByeAndALaterCallOpensANewSession) {
  FakeServer server([](const Received& r, std::size_t) { return well_behaved(r); });
  {
    zrl::Client client(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2));
    client.init(kObsA);
    client.disconnect();
    std::vector<Received> got = server.wait_for(3);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[2].kind, wire::Kind::kBye);
    EXPECT_EQ(got[2].seq, 3u);
    EXPECT_EQ(without_seq(got[2].frame), without_seq(golden("bye")));
    EXPECT_FALSE(client.in_episode());
    EXPECT_THROW(client.send(1.0f, kObsA), zrl::UsageError);

    client.init(kObsA);  // new socket, new hello
    got = server.received();
    ASSERT_EQ(got.size(), 5u);
    EXPECT_EQ(got[3].kind, wire::Kind::kHello);
    EXPECT_NE(got[3].identity, got[0].identity);
  }  // the destructor says BYE too
  const std::vector<Received> got = server.wait_for(6);
  ASSERT_EQ(got.size(), 6u);
  EXPECT_EQ(got[5].kind, wire::Kind::kBye);
}

TEST(Client, InprocEndpointThroughASharedContext) {
  void* ctx = zmq_ctx_new();
  {
    FakeServer::Options o;
    o.endpoint = "inproc://zrl-client-test";
    o.ctx = ctx;
    FakeServer server([](const Received& r, std::size_t) { return well_behaved(r); }, o);
    zrl::ClientOptions options;
    options.zmq_context = ctx;
    zrl::Client client("inproc://zrl-client-test", kObs4, zrl::ActionSpec::discrete(2), options);
    client.init(kObsA);
    EXPECT_DOUBLE_EQ(client.reset(2.0f), 2.0);
  }
  zmq_ctx_term(ctx);
}

TEST(Client, CurveEncryptedSession) {
  if (!zmq_has("curve")) GTEST_SKIP() << "this libzmq was built without CURVE (libsodium)";
  char server_public[41], server_secret[41], client_public[41], client_secret[41], other_public[41], other_secret[41];
  ASSERT_EQ(zmq_curve_keypair(server_public, server_secret), 0);
  ASSERT_EQ(zmq_curve_keypair(client_public, client_secret), 0);
  ASSERT_EQ(zmq_curve_keypair(other_public, other_secret), 0);
  FakeServer::Options o;
  o.curve_secret_key = server_secret;
  FakeServer server([](const Received& r, std::size_t) { return well_behaved(r); }, o);

  zrl::ClientOptions options;
  options.curve_server_key = server_public;
  options.curve_public_key = client_public;
  options.curve_secret_key = client_secret;
  zrl::Client client(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2), options);
  client.init(kObsA);
  EXPECT_DOUBLE_EQ(client.reset(1.0f), 1.0);

  // The same keys from files as `zrl keys generate` (pyzmq's zmq.auth) writes them.
  const std::string dir = testing::TempDir();
  const std::string server_file = dir + "/zrl_client_test_server.key";
  const std::string client_file = dir + "/zrl_client_test_client.key_secret";
  struct Remove {  // the key files go when the test ends, passed or not
    std::vector<std::string> paths;
    ~Remove() {
      for (const auto& p : paths) std::remove(p.c_str());
    }
  } remove_files{{server_file, client_file}};
  std::ofstream(server_file) << "#   ZeroMQ CURVE Public Certificate\n\nmetadata\ncurve\n    public-key = \""
                             << server_public << "\"\n";
  std::ofstream(client_file) << "#   ZeroMQ CURVE **Secret** Certificate\n\nmetadata\ncurve\n    public-key = \""
                             << client_public << "\"\n    secret-key = \"" << client_secret << "\"\n";
  zrl::ClientOptions from_files;
  from_files.load_curve_keys(server_file, client_file);
  EXPECT_EQ(from_files.curve_server_key, server_public);
  EXPECT_EQ(from_files.curve_public_key, client_public);
  EXPECT_EQ(from_files.curve_secret_key, client_secret);
  zrl::Client filed(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2), from_files);
  filed.init(kObsA);
  EXPECT_THROW(from_files.load_curve_keys(server_file, server_file), zrl::UsageError);  // no secret key
  EXPECT_THROW(from_files.load_curve_keys(dir + "/no-such-file", client_file), zrl::UsageError);

  // With the wrong server key the handshake never completes: a timeout.
  options.curve_server_key = other_public;
  options.timeout = milliseconds(200);
  zrl::Client wrong(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2), options);
  EXPECT_THROW(wrong.init(kObsA), zrl::TimeoutError);
}

TEST(Client, ConstructorChecksSpecsAndOptions) {
  const auto d2 = zrl::ActionSpec::discrete(2);
  EXPECT_THROW(zrl::Client("", kObs4, d2), zrl::UsageError);
  EXPECT_THROW(zrl::Client("not-an-endpoint", kObs4, d2), zrl::UsageError);
  EXPECT_THROW(zrl::Client("tcp://127.0.0.1:1", zrl::ObsSpec{{4, 0}}, d2), zrl::UsageError);
  EXPECT_THROW(zrl::Client("tcp://127.0.0.1:1", zrl::ObsSpec{{1, 1, 1, 1, 1, 1, 1}}, d2), zrl::UsageError);
  EXPECT_THROW(zrl::Client("tcp://127.0.0.1:1", zrl::ObsSpec{{4}, zrl::ObsDType::kFloat32, NAN}, d2), zrl::UsageError);
  EXPECT_THROW(zrl::Client("tcp://127.0.0.1:1", kObs4, d2, with_timeout(milliseconds(0))), zrl::UsageError);
  EXPECT_THROW(zrl::ActionSpec::discrete(0), zrl::UsageError);
  EXPECT_THROW(zrl::ActionSpec::box({2, -1}), zrl::UsageError);
  EXPECT_THROW(zrl::ActionSpec::box({1 << 30, 1 << 30, 1 << 30}), zrl::UsageError);
  EXPECT_THROW(zrl::ActionSpec::box({2}, INFINITY), zrl::UsageError);
  zrl::ClientOptions partial;
  partial.curve_server_key = std::string(40, 'a');
  EXPECT_THROW(zrl::Client("tcp://127.0.0.1:1", kObs4, d2, partial), zrl::UsageError);
  zrl::ClientOptions bad_name;
  bad_name.name = "\xff";
  EXPECT_THROW(zrl::Client("tcp://127.0.0.1:1", kObs4, d2, bad_name), zrl::UsageError);
  // Every error is a zrl::Error and a std::runtime_error.
  try {
    zrl::ActionSpec::discrete(-3);
  } catch (const std::runtime_error& e) {
    EXPECT_NE(dynamic_cast<const zrl::Error*>(&e), nullptr);
  }
}

TEST(Client, ATimeoutPastWhatTheClockHoldsIsAHundredYears) {
  // milliseconds::max() ("no deadline") used to overflow now() + timeout: every call timed out at once.
  FakeServer server([](const Received& r, std::size_t) { return well_behaved(r); });
  zrl::Client client(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2), with_timeout(milliseconds::max()));
  EXPECT_EQ(client.timeout(), std::chrono::hours(24 * 365 * 100));
  EXPECT_EQ(client.init(kObsA).index(), 0);
}

TEST(Client, AReplyPastTheSizeCapIsNeverBuffered) {
  // libzmq drops a reply over 64 MiB (and its peer) unread: the call times out, where it
  // used to receive the whole reply first and only then refuse it as too_large.
  FakeServer server([](const Received& r, std::size_t) -> Frames {
    if (r.kind == wire::Kind::kHello) return {std::vector<uint8_t>((std::size_t{64} << 20) + 1, 0)};
    return well_behaved(r);
  });
  zrl::Client client(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2), with_timeout(milliseconds(500)));
  EXPECT_THROW(client.init(kObsA), zrl::TimeoutError);
}

TEST(Client, AMovedFromClientRefusesCallsAndTheMovedToOneWorks) {
  FakeServer server([](const Received& r, std::size_t) { return well_behaved(r); });
  zrl::Client a(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2));
  zrl::Metrics& metrics = a.metrics();
  a.init(kObsA);
  zrl::Client b = std::move(a);
  EXPECT_THROW(a.send(1.0f, kObsA), zrl::UsageError);  // NOLINT(bugprone-use-after-move): on purpose
  EXPECT_TRUE(b.in_episode());
  b.send(1.0f, kObsA);
  metrics.scalar("still_valid", 1.0);  // the Metrics reference follows the session
  EXPECT_DOUBLE_EQ(b.reset(1.0f), 2.0);
  EXPECT_EQ(server.wait_for(5)[3].kind, wire::Kind::kStats);
}

TEST(Client, OneClientPerThreadRunsConcurrently) {
  FakeServer server([](const Received& r, std::size_t) { return well_behaved(r); });
  constexpr int kThreads = 4;
  constexpr int kSteps = 100;
  std::vector<std::thread> threads;
  std::vector<double> returns(kThreads, 0.0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      zrl::Client client(server.endpoint(), kObs4, zrl::ActionSpec::discrete(2));
      client.init(kObsA);
      for (int i = 0; i < kSteps; ++i) client.send(1.0f, kObsB);
      returns[t] = client.reset(1.0f);
    });
  }
  for (std::thread& t : threads) t.join();
  for (double r : returns) EXPECT_DOUBLE_EQ(r, kSteps + 1.0);
  std::set<std::string> identities;
  for (const Received& r : server.received()) identities.insert(r.identity);
  EXPECT_EQ(identities.size(), static_cast<std::size_t>(kThreads));
}

}  // namespace
