// Sending and receiving on pyzmq's sockets from C++: the per-message hot paths.
//
// pyzmq spends ~1 us of Python per send and 1.5-2 us per recv (its sugar layer,
// a Frame object, the call), which for a 2 KB trajectory chunk is more than the
// message costs ZeroMQ itself. Two loops run here instead:
//
//   - stamp_header + send: an actor's chunk boundary. Python has written the
//     frame in place (wire.Layout); this stamps the fields that change per
//     message (seq, policy_version, total length) into its header and hands it
//     to zmq_send (which copies it), in one call from Python;
//   - send_zero_copy: the same for a large frame (an Atari chunk), without the
//     copy: libzmq holds a SendBlock (below) until it has sent it, and frees its
//     hold from its own thread without touching Python;
//   - drain: the learner's receiver. A burst of messages from the PULL socket,
//     each checked by the FrameGate (wire_gate.h), all with the GIL released.
//
// The sockets belong to pyzmq, and so does the libzmq they live in: another copy
// of libzmq could not use them. So nothing here links libzmq. `ZmqApi::attach`
// takes a handle (RTLD_NOLOAD: never loading anything) to pyzmq's own extension
// module and looks the functions up through it, which finds them where that
// module finds them (in the libzmq it was linked with). It checks that library's
// version against the one pyzmq reports. Where any of that fails (no dlopen, a
// pyzmq with libzmq's symbols hidden inside it), it says why and the callers keep
// pyzmq's own send and recv: zrl/transport.py decides.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "wire/wire_gate.h"

namespace zrl {

// zmq_msg_t: 64 opaque bytes, pointer-aligned (zmq.h, libzmq 4.x).
struct alignas(sizeof(void*)) ZmqMsg {
  unsigned char bytes[64];
};

inline constexpr int kZmqDontWait = 1;  // ZMQ_DONTWAIT
inline constexpr int kZmqSndMore = 2;   // ZMQ_SNDMORE
inline constexpr int kZmqRcvTimeo = 27;  // ZMQ_RCVTIMEO

struct ZmqApi {
  int (*send)(void* socket, const void* buf, std::size_t len, int flags) = nullptr;
  int (*msg_init)(ZmqMsg*) = nullptr;
  int (*msg_init_data)(ZmqMsg*, void* data, std::size_t size, void (*ffn)(void* data, void* hint), void* hint) = nullptr;
  int (*msg_send)(ZmqMsg*, void* socket, int flags) = nullptr;
  int (*msg_recv)(ZmqMsg*, void* socket, int flags) = nullptr;
  void* (*msg_data)(ZmqMsg*) = nullptr;
  std::size_t (*msg_size)(const ZmqMsg*) = nullptr;
  int (*msg_close)(ZmqMsg*) = nullptr;
  int (*msg_move)(ZmqMsg* dest, ZmqMsg* src) = nullptr;
  int (*msg_more)(const ZmqMsg*) = nullptr;
  int (*setsockopt)(void* socket, int option, const void* value, std::size_t len) = nullptr;
  int (*getsockopt)(void* socket, int option, void* value, std::size_t* len) = nullptr;
  int (*errno_)() = nullptr;
  const char* (*strerror)(int) = nullptr;
  std::string library;  // the file the functions were found in

  // The libzmq that the already loaded shared object `module` (pyzmq's backend
  // extension) uses, if its version is major.minor.patch; else nullptr with *why
  // set. The result lives as long as the process.
  static const ZmqApi* attach(const std::string& module, int major, int minor, int patch, std::string* why);
};

// The header fields that change from message to message (docs/PROTOCOL.md):
// seq, policy_version and the frame's total length, little-endian, into the
// first `total` of a buffer of `size` bytes; false (nothing written) unless
// total covers a header and fits in the buffer.
bool stamp_header(uint8_t* frame, std::size_t size, uint64_t seq, uint64_t policy_version, uint64_t total);

// A copy within a frame, frame[to, to + n) = frame[from, from + n) (the ranges may
// overlap): how send_frame writes the next chunk's bootstrap row into a frame that
// went out copied, in the same call as the send.
struct RowCopy {
  uint64_t to = 0, from = 0, n = 0;

  // Whether both ranges lie inside a frame of `size` bytes (no overflow for any values).
  bool fits(std::size_t size) const { return n <= size && to <= size - n && from <= size - n; }
  void apply(uint8_t* frame) const {
    if (n != 0) std::memmove(frame + to, frame + from, n);
  }
};

// zmq_send(socket, data, n, flags); returns 0, or zmq_errno() of the failed send
// (EAGAIN: ZMQ_DONTWAIT found the queue full). Call a blocking send without the GIL.
int send(const ZmqApi& api, void* socket, const void* data, std::size_t n, int flags);

// A frame buffer that Python fills and libzmq sends without copying. pyzmq's own
// zero-copy send has libzmq's free callback hand each sent frame to a garbage-
// collector thread, which takes the GIL to drop its reference: ~20 us of Python
// per message. Here the callback drops a count instead. `refs` is 1 for the owner
// (zrl._core.SendBuffer) plus one per message in flight; whoever drops the last
// frees the block, so the bytes outlive an owner that goes while libzmq still
// sends them. The data is zeroed and 64-byte aligned.
struct SendBlock {
  std::atomic<int> refs{1};
  std::size_t size = 0;
  uint8_t* data = nullptr;  // 64-byte aligned, inside `memory`
  void* memory = nullptr;   // what calloc returned (zeroed lazily: large blocks come fresh from mmap)
};
SendBlock* new_send_block(std::size_t size);  // nullptr if out of memory
void release_send_block(SendBlock* block);    // drops one reference
inline int in_flight(const SendBlock& block) { return block.refs.load(std::memory_order_acquire) - 1; }

// Sends block->data[:n] without a copy: 0, or zmq_errno() of the failed send, with
// the block's count as before. The caller must not write the block while
// in_flight() > 0. Call a blocking send without the GIL.
int send_zero_copy(const ZmqApi& api, void* socket, SendBlock* block, std::size_t n, int flags);

// Receives up to `max` messages from `socket`, checking each with `gate`, into *out
// (cleared first; each message is open and the caller closes it). The first waits
// up to wait_ms (0: not at all, -1: for ever) in a blocking zmq_msg_recv, the rest
// not at all. Stops early at an empty queue (EAGAIN, or the wait timing out); any
// other error stops it too and is returned as zmq_errno() (0 if none). A first
// message waited for longer than alone_after_ns is the burst alone: it came to an
// empty queue, and asking again would only find the queue empty (a system call and
// a wake-up more per burst than a blocking recv makes). Call without the GIL.
struct Drained {
  ZmqMsg msg;
  GateResult gate;
};
inline constexpr std::int64_t kAloneAfterNs = 2000;  // a receive of a queued message takes < 1 us
int drain(const ZmqApi& api, void* socket, const FrameGate& gate, std::size_t max, std::vector<Drained>* out,
          int wait_ms = 0, std::int64_t alone_after_ns = kAloneAfterNs);

}  // namespace zrl
