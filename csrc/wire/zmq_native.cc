#include "wire/zmq_native.h"

#include <dlfcn.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <mutex>
#include <utility>

#include "zrl/wire_format.h"

namespace zrl {
namespace {

template <typename F>
bool sym(void* handle, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  return *out != nullptr;
}

}  // namespace

const ZmqApi* ZmqApi::attach(const std::string& module, int major, int minor, int patch, std::string* why) {
  // One lookup per (module, version); callers ask for pyzmq's, so in practice one.
  static std::mutex mu;
  static std::vector<std::pair<std::string, std::unique_ptr<ZmqApi>>> found;
  const std::string want = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  const std::string key = module + "@" + want;
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [k, api] : found)
    if (k == key) return api.get();

  if (module.empty()) {  // (dlopen("") would be the main program)
    *why = "no module path to look libzmq up through";
    return nullptr;
  }
  // RTLD_NOLOAD: a handle to the module only if it is loaded already (it is: the
  // caller imported pyzmq). dlsym through it searches the module, then the
  // libraries it was linked with, in order: where the module's own calls go.
  void* handle = dlopen(module.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (!handle) {
    const char* err = dlerror();
    *why = module + " is not loaded (" + (err ? err : "dlopen failed") + ")";
    return nullptr;
  }
  auto api = std::make_unique<ZmqApi>();
  void (*version)(int*, int*, int*) = nullptr;
  const bool ok = sym(handle, "zmq_version", &version) && sym(handle, "zmq_send", &api->send) &&
                  sym(handle, "zmq_msg_init", &api->msg_init) &&
                  sym(handle, "zmq_msg_init_data", &api->msg_init_data) && sym(handle, "zmq_msg_send", &api->msg_send) && sym(handle, "zmq_msg_recv", &api->msg_recv) &&
                  sym(handle, "zmq_msg_data", &api->msg_data) && sym(handle, "zmq_msg_size", &api->msg_size) &&
                  sym(handle, "zmq_msg_close", &api->msg_close) && sym(handle, "zmq_msg_move", &api->msg_move) &&
                  sym(handle, "zmq_msg_more", &api->msg_more) &&
                  sym(handle, "zmq_setsockopt", &api->setsockopt) && sym(handle, "zmq_getsockopt", &api->getsockopt) &&
                  sym(handle, "zmq_errno", &api->errno_) && sym(handle, "zmq_strerror", &api->strerror);
  // The handle stays open either way: it only pins what pyzmq keeps loaded anyway.
  if (!ok) {
    *why = "libzmq's functions are not visible through " + module + " (libzmq linked in statically?)";
    return nullptr;
  }
  int v[3] = {0, 0, 0};
  version(&v[0], &v[1], &v[2]);
  const std::string got = std::to_string(v[0]) + "." + std::to_string(v[1]) + "." + std::to_string(v[2]);
  Dl_info info;
  api->library = dladdr(reinterpret_cast<void*>(api->send), &info) && info.dli_fname ? info.dli_fname : module;
  if (got != want) {
    *why = api->library + " is libzmq " + got + ", but pyzmq reports " + want;
    return nullptr;
  }
  found.emplace_back(key, std::move(api));
  return found.back().second.get();
}

bool stamp_header(uint8_t* frame, std::size_t size, uint64_t seq, uint64_t policy_version, uint64_t total) {
  if (total < wire::kHeaderSize || total > size) return false;
  wire::store_le<uint64_t>(frame + wire::kSeqOffset, seq);
  wire::store_le<uint64_t>(frame + wire::kPolicyVersionOffset, policy_version);
  wire::store_le<uint64_t>(frame + wire::kTotalOffset, total);
  return true;
}

int send(const ZmqApi& api, void* socket, const void* data, std::size_t n, int flags) {
  return api.send(socket, data, n, flags) < 0 ? api.errno_() : 0;
}

SendBlock* new_send_block(std::size_t size) {
  // calloc rather than aligned_alloc + memset: a large block comes from mmap, already
  // zero, so no page is touched until Python writes it.
  void* memory = std::calloc(size + 64, 1);
  if (!memory) return nullptr;
  auto* block = new (std::nothrow) SendBlock;
  if (!block) {
    std::free(memory);
    return nullptr;
  }
  const auto at = reinterpret_cast<uintptr_t>(memory);
  block->size = size;
  block->data = reinterpret_cast<uint8_t*>((at + 63) & ~static_cast<uintptr_t>(63));
  block->memory = memory;
  return block;
}

void release_send_block(SendBlock* block) {
  // acq_rel: the last one to let go sees every write (and libzmq's reads) before it frees.
  if (block->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    std::free(block->memory);
    delete block;
  }
}

namespace {
// libzmq's free callback: runs on whichever thread drops the message last (an I/O
// thread, or the receiver's over inproc), never needing the GIL.
void sent(void* /*data*/, void* hint) { release_send_block(static_cast<SendBlock*>(hint)); }
}  // namespace

int send_zero_copy(const ZmqApi& api, void* socket, SendBlock* block, std::size_t n, int flags) {
  if (n > block->size) return EINVAL;
  block->refs.fetch_add(1, std::memory_order_relaxed);  // the message's, dropped by sent()
  ZmqMsg msg;
  if (api.msg_init_data(&msg, block->data, n, &sent, block) != 0) {
    const int e = api.errno_();
    release_send_block(block);  // (libzmq calls no callback for a message it never made)
    return e;
  }
  if (api.msg_send(&msg, socket, flags) < 0) {
    const int e = api.errno_();
    api.msg_close(&msg);  // still ours: closing it runs sent()
    return e;
  }
  return 0;
}

int drain(const ZmqApi& api, void* socket, const FrameGate& gate, std::size_t max, std::vector<Drained>* out,
          int wait_ms, std::int64_t alone_after_ns) {
  out->clear();
  out->reserve(max);
  // The wait is a blocking recv under ZMQ_RCVTIMEO (set for it, then put back): where
  // the queue is empty, libzmq then sleeps on its mailbox in one poll, where a
  // zmq_poll before a non-blocking recv makes three to four system calls.
  int saved_timeout = -1;
  std::size_t len = sizeof saved_timeout;
  const bool wait = wait_ms != 0 && max > 0 &&
                    api.getsockopt(socket, kZmqRcvTimeo, &saved_timeout, &len) == 0 &&
                    api.setsockopt(socket, kZmqRcvTimeo, &wait_ms, sizeof wait_ms) == 0;
  while (out->size() < max) {
    out->emplace_back();
    Drained& d = out->back();
    api.msg_init(&d.msg);
    const int flags = wait && out->size() == 1 ? 0 : kZmqDontWait;
    int rc;
    int e = 0;
    const auto start = std::chrono::steady_clock::now();  // (vDSO: tens of ns)
    do {  // (pyzmq retries an interrupted recv too)
      rc = api.msg_recv(&d.msg, socket, flags);
      e = rc < 0 ? api.errno_() : 0;
    } while (rc < 0 && e == EINTR);
    // A first message that took longer than alone_after_ns came after a sleep: the
    // queue was empty, and most likely still is. The burst is that message alone,
    // without the non-blocking receive that would find the queue empty (a poll of
    // libzmq's mailbox, and the pipe put to sleep), so the next call's blocking
    // receive goes as a plain blocking recv does.
    const bool alone = wait && out->size() == 1 &&
                       std::chrono::steady_clock::now() - start > std::chrono::nanoseconds(alone_after_ns);
    if (wait && out->size() == 1) api.setsockopt(socket, kZmqRcvTimeo, &saved_timeout, sizeof saved_timeout);
    if (rc < 0) {
      api.msg_close(&d.msg);
      out->pop_back();
      return e == EAGAIN ? 0 : e;
    }
    d.gate = gate.check(static_cast<const uint8_t*>(api.msg_data(&d.msg)), api.msg_size(&d.msg));
    if (alone) break;
  }
  return 0;
}

}  // namespace zrl
