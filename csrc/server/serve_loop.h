// ServeLoop: the agent server's request loop for the requests that are routine.
//
// Nearly every request a simulator sends is an ACT in the middle of an episode:
// a reward, the next observation, and a wait for the next action. Python costs
// several times raw ZeroMQ for that round trip (decode, session lookup, a torch
// call, encode). Here it runs in C++ with the GIL released: receive a burst
// from the clients' ROUTER, look each sender up, check the frame (a FrameGate
// for the one routine ACT layout), batch the ready observations through an
// MlpPolicy, draw the actions, write the step into the session's chunk (the
// recorder's own arrays, so the frame the learner gets is the one Python would
// have written) and send each ACTION.
//
// Python keeps every decision: it opens and closes sessions, handles HELLO, BYE,
// STATS, episode starts and ends, chunk ends and every request that fails a
// check, and hands a session over ("arms" it) once the session is in a state
// where its next routine ACT needs nothing but the above. An ACT that completes
// the session's chunk is answered here too, and the chunk is handed to Python
// (a Completion) to send. Only frames laid out as Python's own encoder (and
// libzrl_client's) lays out a routine ACT are served here. Anything else a
// session sends comes back to Python, with the session disarmed, in arrival
// order; Python takes the session's state back (`take`) before it acts on it.
// A session that sends twice before its reply (pipelining) is handed back whole,
// both requests, so Python's rules refuse it as they would have.
//
// Not thread-safe: the server's thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/mlp_policy.h"
#include "replay/rng.h"
#include "wire/wire_gate.h"
#include "wire/zmq_native.h"

namespace zrl {

// Where one session's step rows live: the recorder's chunk arrays (K = 1 env),
// rows t of [T] (action [T, A] for Box actions), obs rows of [T + 1, obs_dim].
struct ChunkRows {
  float* obs = nullptr;
  void* action = nullptr;  // int64 (discrete) or float32 [A]
  float* reward = nullptr;
  uint8_t* terminated = nullptr;
  uint8_t* truncated = nullptr;
  float* behaviour_logp = nullptr;
  int64_t T = 0;
};

// A session's counters, handed over at arm and back at take.
struct SessionState {
  int64_t t = 0;  // the row of the reward the next ACT brings (the recorder's t)
  int64_t steps = 0;
  int64_t episode_length = 0;
  double episode_return = 0.0;
  double last_seen = 0.0;  // steady_clock seconds (Python's time.monotonic)
};

// A session whose ACT completed its chunk: answered here, its last row written; the
// chunk goes to Python (the recorder sends it and starts the next one) with the action
// just drawn, which belongs to the next chunk's first row.
struct Completion {
  int64_t id = 0;
  int64_t discrete = 0;           // the action, for discrete actions
  std::vector<float> continuous;  // the action, for Box actions
  float behaviour_logp = 0.0f;
};

// What one serve() call did, for the server's counters.
struct ServeCounts {
  int64_t requests = 0;      // answered here
  int64_t batches = 0;       // forward passes
  int64_t reply_unread = 0;  // replies a client's full queue refused
};

class ServeLoop {
 public:
  // `socket`: the clients' ROUTER (pyzmq's Socket.underlying), `max_bytes` the request
  // cap; actions are discrete (action_dim 0) or float32 [action_dim]; `seed` seeds the draws.
  ServeLoop(const ZmqApi* api, void* socket, std::size_t obs_dim, std::size_t action_dim, uint64_t max_bytes,
            uint64_t seed);

  // The routine ACT frame's descriptor block (as the wire's encoders write it), with
  // the byte offsets of obs, reward and flags in such frames (std::invalid_argument
  // when they lie outside the arrays' span [first, end)). Python's checks of such a
  // frame are the gate's: the layout, and finite obs and reward.
  void add_act_layout(const std::string& block, uint64_t first, uint64_t end, uint64_t obs, uint64_t reward,
                        uint64_t flags);
  // The reply to a routine ACT: a template frame, its action at `action_offset`.
  void set_action_template(std::vector<uint8_t> frame, uint64_t action_offset);
  void set_policy(std::shared_ptr<MlpPolicy> policy, std::vector<float> log_std, uint64_t version);

  // Hands session `id` (routing identity `identity`) to the loop with its rows and counters.
  void arm(int64_t id, const std::string& identity, const ChunkRows& rows, const SessionState& state);
  // Takes session `id` back: its counters if the loop held it since the last arm
  // (and does no longer), else false.
  bool take(int64_t id, SessionState* out);
  double last_seen(int64_t id) const;  // -1 when not armed
  void forget(int64_t id);             // the session is closed
  bool armed(int64_t id) const;

  // Serves for up to budget_ms: bursts of up to max_batch requests, the first
  // waited for up to wait_ms. Routine ACTs are answered; everything else is
  // appended to *handback as (identity, frame, further parts...) messages, in
  // arrival order, chunks completed go to *completed (their sessions disarmed),
  // and the call returns after a burst with either. Returns zmq_errno() of a
  // failed receive (0 if none).
  int serve(int wait_ms, std::size_t max_batch, double budget_ms, std::vector<std::vector<ZmqMsg>>* handback,
            std::vector<Completion>* completed, ServeCounts* counts);

  const ZmqApi* api() const { return api_; }
  bool ready() const { return policy_ != nullptr && !template_.empty() && !layouts_.empty(); }

 private:
  struct Session {
    std::string identity;
    ChunkRows rows;
    SessionState state;
    bool armed = false;  // its next routine ACT is served here
    bool held = false;   // armed since the last take (take returns its state)
    int64_t in_batch = -1;  // its entry in the burst being served
  };
  struct Entry {
    int64_t id;
    std::vector<ZmqMsg> parts;  // identity, frame
    int layout;
    uint64_t seq;
    bool live = true;
  };
  struct ActOffsets {
    uint64_t obs, reward, flags;
  };

  bool receive(std::vector<ZmqMsg>* parts, int flags, int* err);
  void route(std::vector<ZmqMsg> parts, std::vector<Entry>* batch, std::vector<std::vector<ZmqMsg>>* handback);
  void hand_back(Session* s, std::vector<Entry>* batch, std::vector<std::vector<ZmqMsg>>* handback);
  void answer(std::vector<Entry>* batch, std::vector<std::vector<ZmqMsg>>* handback,
              std::vector<Completion>* completed, ServeCounts* counts);
  void draw(std::size_t n, std::vector<bool>* bad);
  void record_and_reply(Entry& e, std::size_t row, std::vector<Completion>* completed, ServeCounts* counts);
  void reply(const Entry& e, std::size_t row, ServeCounts* counts);
  void close_all(std::vector<ZmqMsg>* parts);
  double normal();

  const ZmqApi* api_;
  void* socket_;
  std::size_t obs_dim_, action_dim_;
  FrameGate gate_;
  std::vector<ActOffsets> layouts_;  // by FrameGate layout id
  std::vector<uint8_t> template_;
  uint64_t action_offset_ = 0;
  std::shared_ptr<MlpPolicy> policy_;
  std::vector<float> log_std_;
  uint64_t version_ = 0;
  std::unordered_map<int64_t, Session> sessions_;
  std::unordered_map<std::string, int64_t> by_identity_;
  Xoshiro256pp rng_;
  // Scratch, reused across calls.
  std::vector<float> obs_, params_;
  std::vector<double> draws_;
  std::vector<int64_t> discrete_;
  std::vector<float> continuous_, logp_;
  std::vector<uint8_t> reply_;
  std::vector<std::size_t> rows_;
};

}  // namespace zrl
