// GoogleTest of zmq_native: attaching to a loaded libzmq through a module that
// links it, then stamp + send and a gated drain over inproc. Here the module is
// libzmq itself (this test links it); in zrl it is pyzmq's extension.
#include "wire/zmq_native.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <zmq.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/gate_frame.h"

namespace {

using zrl::testing::Frame;

std::string loaded_libzmq() {
  Dl_info info;
  if (!dladdr(reinterpret_cast<void*>(&zmq_send), &info) || !info.dli_fname) return "";
  return info.dli_fname;
}

const zrl::ZmqApi* attach() {
  std::string why;
  const zrl::ZmqApi* api = zrl::ZmqApi::attach(loaded_libzmq(), ZMQ_VERSION_MAJOR, ZMQ_VERSION_MINOR, ZMQ_VERSION_PATCH, &why);
  EXPECT_NE(api, nullptr) << why;
  return api;
}

uint64_t get64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

struct Pair {
  void* ctx = zmq_ctx_new();
  void* push = zmq_socket(ctx, ZMQ_PUSH);
  void* pull = zmq_socket(ctx, ZMQ_PULL);
  Pair() {
    EXPECT_EQ(zmq_bind(pull, "inproc://zmq-native-test"), 0);
    EXPECT_EQ(zmq_connect(push, "inproc://zmq-native-test"), 0);
  }
  ~Pair() {
    int zero = 0;
    zmq_setsockopt(push, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(push);
    zmq_close(pull);
    zmq_ctx_term(ctx);
  }
};

TEST(ZmqNative, AttachesToTheLoadedLibraryAndChecksItsVersion) {
  const zrl::ZmqApi* api = attach();
  ASSERT_NE(api, nullptr);
  EXPECT_NE(api->library.find("libzmq"), std::string::npos) << api->library;
  EXPECT_EQ(attach(), api);  // one lookup, remembered

  std::string why;
  EXPECT_EQ(zrl::ZmqApi::attach(loaded_libzmq(), ZMQ_VERSION_MAJOR + 1, 0, 0, &why), nullptr);
  EXPECT_NE(why.find("but pyzmq reports"), std::string::npos) << why;
  EXPECT_EQ(zrl::ZmqApi::attach("/nonexistent/libzmq.so", 4, 3, 4, &why), nullptr);
  EXPECT_NE(why.find("is not loaded"), std::string::npos) << why;
}

// The library, an inproc PUSH/PULL pair, a frame and an empty gate.
class ZmqNativeIo : public ::testing::Test {
 protected:
  void SetUp() override {
    api = attach();
    ASSERT_NE(api, nullptr);
  }
  const zrl::ZmqApi* api = nullptr;
  Pair p;
  Frame f;
  zrl::FrameGate gate{zrl::testing::kTrajectory, 1 << 20};
};

TEST_F(ZmqNativeIo, StampedFramesComeOutOfADrainChecked) {
  const std::vector<uint8_t> before = f.bytes;  // a length shorter than a header, or past the buffer: nothing written
  EXPECT_FALSE(zrl::stamp_header(f.bytes.data(), f.bytes.size(), 1, 1, 47));
  EXPECT_FALSE(zrl::stamp_header(f.bytes.data(), f.bytes.size(), 1, 1, f.bytes.size() + 1));
  EXPECT_EQ(f.bytes, before);
  ASSERT_EQ(gate.add(f.block(), Frame::kAction, Frame::kEnd, {zrl::GateBound{Frame::kAction, 4, 8, 6}}), 0);

  for (uint64_t seq = 1; seq <= 3; ++seq) {
    ASSERT_TRUE(zrl::stamp_header(f.bytes.data(), f.bytes.size(), seq, 10 + seq, Frame::kEnd));
    ASSERT_EQ(zrl::send(*api, p.push, f.bytes.data(), Frame::kEnd, zrl::kZmqDontWait), 0);
  }
  zrl::testing::put<int64_t>(f.bytes, Frame::kAction, 6);  // out of bounds: not vouched for
  ASSERT_TRUE(zrl::stamp_header(f.bytes.data(), f.bytes.size(), 4, 14, Frame::kEnd));
  ASSERT_EQ(zrl::send(*api, p.push, f.bytes.data(), Frame::kEnd, zrl::kZmqDontWait), 0);

  std::vector<zrl::Drained> out;
  ASSERT_EQ(zrl::drain(*api, p.pull, gate, 8, &out), 0);
  ASSERT_EQ(out.size(), 4u);
  for (std::size_t i = 0; i < out.size(); ++i) {
    auto* data = static_cast<const uint8_t*>(api->msg_data(&out[i].msg));
    ASSERT_EQ(api->msg_size(&out[i].msg), Frame::kEnd);
    EXPECT_EQ(get64(data + 16), i + 1);   // seq
    EXPECT_EQ(get64(data + 24), 11 + i);  // policy version
    EXPECT_EQ(get64(data + 40), Frame::kEnd);
    if (i < 3) {
      EXPECT_EQ(out[i].gate.layout, 0);
      EXPECT_EQ(out[i].gate.seq, i + 1);
      EXPECT_EQ(out[i].gate.policy_version, 11 + i);
    } else {
      EXPECT_EQ(out[i].gate.layout, -1);
    }
    api->msg_close(&out[i].msg);
  }
  ASSERT_EQ(zrl::drain(*api, p.pull, gate, 8, &out), 0);  // empty: EAGAIN is no error
  EXPECT_TRUE(out.empty());
}

TEST_F(ZmqNativeIo, ADrainStopsAtItsMaximumAndSendsReportErrors) {
  for (int i = 0; i < 5; ++i) ASSERT_EQ(zrl::send(*api, p.push, f.bytes.data(), Frame::kEnd, 0), 0);
  std::vector<zrl::Drained> out;
  ASSERT_EQ(zrl::drain(*api, p.pull, gate, 3, &out), 0);
  EXPECT_EQ(out.size(), 3u);
  for (auto& d : out) api->msg_close(&d.msg);
  ASSERT_EQ(zrl::drain(*api, p.pull, gate, 3, &out), 0);
  EXPECT_EQ(out.size(), 2u);
  for (auto& d : out) api->msg_close(&d.msg);

  // A PUSH socket with no peer queues nothing: EAGAIN without waiting.
  void* lonely = zmq_socket(p.ctx, ZMQ_PUSH);
  EXPECT_EQ(zrl::send(*api, lonely, f.bytes.data(), Frame::kEnd, zrl::kZmqDontWait), EAGAIN);
  zmq_close(lonely);
  // A PULL socket cannot send: the errno comes back.
  EXPECT_EQ(zrl::send(*api, p.pull, f.bytes.data(), Frame::kEnd, zrl::kZmqDontWait), ENOTSUP);
}

TEST_F(ZmqNativeIo, ADrainWaitsForItsFirstMessageOnlyAndPutsTheTimeoutBack) {
  int timeout = 1234;
  ASSERT_EQ(zmq_setsockopt(p.pull, ZMQ_RCVTIMEO, &timeout, sizeof timeout), 0);
  auto rcvtimeo = [&] {
    int v = 0;
    std::size_t len = sizeof v;
    EXPECT_EQ(zmq_getsockopt(p.pull, ZMQ_RCVTIMEO, &v, &len), 0);
    return v;
  };
  std::vector<zrl::Drained> out;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(zrl::drain(*api, p.pull, gate, 8, &out, 20), 0);  // nothing comes: the wait ends it, no error
  EXPECT_TRUE(out.empty());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(15));
  EXPECT_EQ(rcvtimeo(), 1234);

  // A sender on another thread: whether its messages come before the wait or during it,
  // the drain returns the first and whatever followed it without waiting again.
  std::thread sender([&] {
    for (int i = 0; i < 3; ++i) EXPECT_EQ(zrl::send(*api, p.push, f.bytes.data(), Frame::kEnd, 0), 0);
  });
  std::size_t got = 0;
  while (got < 3) {
    ASSERT_EQ(zrl::drain(*api, p.pull, gate, 8, &out, 10000), 0);
    ASSERT_FALSE(out.empty()) << "nothing within 10 s after " << got;
    got += out.size();
    for (auto& d : out) api->msg_close(&d.msg);
  }
  sender.join();
  EXPECT_EQ(got, 3u);
  EXPECT_EQ(rcvtimeo(), 1234);
  ASSERT_EQ(zrl::drain(*api, p.pull, gate, 0, &out, -1), 0);  // max 0: no wait at all, even "for ever"
  EXPECT_TRUE(out.empty());
}

TEST_F(ZmqNativeIo, AFirstMessageThatWasWaitedForIsItsBurstAlone) {
  for (int i = 0; i < 3; ++i) ASSERT_EQ(zrl::send(*api, p.push, f.bytes.data(), Frame::kEnd, 0), 0);
  std::vector<zrl::Drained> out;
  auto drain_all = [&](std::int64_t alone_after_ns) {
    std::size_t got = 0, bursts = 0;
    while (got < 3) {
      EXPECT_EQ(zrl::drain(*api, p.pull, gate, 8, &out, 10000, alone_after_ns), 0);
      if (out.empty()) return std::make_pair(got, bursts);  // (a failure: nothing within 10 s)
      got += out.size();
      ++bursts;
      for (auto& d : out) api->msg_close(&d.msg);
    }
    return std::make_pair(got, bursts);
  };
  // Every receive takes longer than 0 ns: each first message counts as waited for.
  EXPECT_EQ(drain_all(0), std::make_pair(std::size_t{3}, std::size_t{3}));
  // Without a wait, or with a threshold no receive reaches, the burst takes what is queued.
  for (int i = 0; i < 3; ++i) ASSERT_EQ(zrl::send(*api, p.push, f.bytes.data(), Frame::kEnd, 0), 0);
  std::size_t got = 0;
  while (got < 3) {  // (over inproc a sent message is queued at once, but take no chance on one burst)
    ASSERT_EQ(zrl::drain(*api, p.pull, gate, 8, &out, 10000, std::int64_t{1} << 62), 0);
    ASSERT_FALSE(out.empty());
    got += out.size();
    for (auto& d : out) api->msg_close(&d.msg);
  }
  EXPECT_EQ(got, 3u);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(zrl::send(*api, p.push, f.bytes.data(), Frame::kEnd, 0), 0);
  ASSERT_EQ(zrl::drain(*api, p.pull, gate, 8, &out, 0, 0), 0);  // wait_ms 0: the rule does not apply
  EXPECT_EQ(out.size(), 3u);
  for (auto& d : out) api->msg_close(&d.msg);
}

TEST_F(ZmqNativeIo, AZeroCopySendHoldsItsBlockUntilLibzmqLetsGo) {
  zrl::SendBlock* block = zrl::new_send_block(100000);
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(block->data) % 64, 0u);
  EXPECT_EQ(block->data[0], 0);
  EXPECT_EQ(block->data[99999], 0);
  EXPECT_EQ(zrl::in_flight(*block), 0);
  std::memset(block->data, 5, block->size);
  EXPECT_EQ(zrl::send_zero_copy(*api, p.push, block, block->size + 1, 0), EINVAL);  // longer than the block
  EXPECT_EQ(zrl::in_flight(*block), 0);

  ASSERT_EQ(zrl::send_zero_copy(*api, p.push, block, 70000, zrl::kZmqDontWait), 0);
  EXPECT_EQ(zrl::in_flight(*block), 1);
  zrl::release_send_block(block);  // the owner goes first: libzmq's hold keeps the bytes

  zmq_msg_t msg;
  zmq_msg_init(&msg);
  ASSERT_EQ(zmq_msg_recv(&msg, p.pull, 0), 70000);
  EXPECT_EQ(zmq_msg_data(&msg), static_cast<void*>(block->data));  // inproc: the same bytes, uncopied
  EXPECT_EQ(static_cast<const uint8_t*>(zmq_msg_data(&msg))[69999], 5);
  zmq_msg_close(&msg);  // frees the block (a leak or double free shows under a sanitizer)
}

TEST_F(ZmqNativeIo, AZeroCopySendThatFailsGivesTheBlockBack) {
  zrl::SendBlock* block = zrl::new_send_block(1000);
  ASSERT_NE(block, nullptr);
  void* lonely = zmq_socket(p.ctx, ZMQ_PUSH);  // no peer: EAGAIN
  EXPECT_EQ(zrl::send_zero_copy(*api, lonely, block, 1000, zrl::kZmqDontWait), EAGAIN);
  EXPECT_EQ(zrl::in_flight(*block), 0);
  EXPECT_EQ(zrl::send_zero_copy(*api, p.pull, block, 1000, zrl::kZmqDontWait), ENOTSUP);
  EXPECT_EQ(zrl::in_flight(*block), 0);
  zmq_close(lonely);
  zrl::release_send_block(block);
}

}  // namespace
