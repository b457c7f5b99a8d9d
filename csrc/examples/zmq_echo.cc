// zmq_echo — the raw ZeroMQ reference of `zrl bench client`: a ROUTER that
// sends every message back to its sender as it came, in C++, so the floor it
// sets is ZeroMQ's alone (a Python echo adds its interpreter to the floor).
//
//   zmq_echo [--bind ENDPOINT]     (default tcp://127.0.0.1:*)
//
// Prints the bound endpoint on its first line, then echoes until killed.
#include <zmq.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  std::string bind = "tcp://127.0.0.1:*";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--bind") == 0 && i + 1 < argc) {
      bind = argv[++i];
    } else {
      std::fprintf(stderr, "usage: zmq_echo [--bind ENDPOINT]\n");
      return 1;
    }
  }
  void* ctx = zmq_ctx_new();
  void* sock = zmq_socket(ctx, ZMQ_ROUTER);
  const int zero = 0;
  zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero));
  if (zmq_bind(sock, bind.c_str()) != 0) {
    std::fprintf(stderr, "zmq_echo: cannot bind %s: %s\n", bind.c_str(), zmq_strerror(zmq_errno()));
    return 1;
  }
  char endpoint[256];
  std::size_t len = sizeof(endpoint);
  zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, endpoint, &len);
  std::printf("%s\n", endpoint);
  std::fflush(stdout);
  std::vector<zmq_msg_t> parts;
  while (true) {
    parts.clear();
    int more = 1;
    while (more) {  // one whole message: its identity frame, then the request
      parts.emplace_back();
      zmq_msg_init(&parts.back());
      if (zmq_msg_recv(&parts.back(), sock, 0) < 0) {
        if (zmq_errno() == EINTR) {
          zmq_msg_close(&parts.back());
          parts.pop_back();
          continue;
        }
        std::fprintf(stderr, "zmq_echo: receive failed: %s\n", zmq_strerror(zmq_errno()));
        return 1;
      }
      more = zmq_msg_more(&parts.back());
    }
    for (std::size_t k = 0; k < parts.size(); ++k) {
      // zmq_msg_send takes the message over: nothing to close once it went.
      if (zmq_msg_send(&parts[k], sock, k + 1 < parts.size() ? ZMQ_SNDMORE : 0) < 0) zmq_msg_close(&parts[k]);
    }
  }
}
