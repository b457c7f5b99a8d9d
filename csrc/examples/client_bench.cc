// client_bench — the latency of one zrl::Client step, measured in a process
// of its own, beside a plain ZeroMQ round trip of the same size.
//
//   client_bench --endpoint E --steps N --warmup W --out FILE
//                [--mode zrl|raw] [--obs-dim D] [--actions A] [--timeout-ms T]
//
// --mode zrl (default): a zrl::Client with ObsSpec float32 [D] (default 4)
//   and ActionSpec discrete(A) (default 2; both must match the server's
//   config) talks to the agent server at E: init(), then W untimed send()
//   calls, then N timed send() calls, each a full round trip (encode, send,
//   the server's inference, receive, decode). Every 200 send() calls the
//   episode ends with reset() and a new one starts with init(); those two
//   calls are not timed. The dummy observation changes at every step.
// --mode raw: the reference. A DEALER socket sends E a frame of exactly the
//   size of the ACT above (header, descriptors, D float32 values, reward,
//   flags: see act_frame_bytes) and waits for one frame back; E is a raw
//   ZeroMQ echo ROUTER. W untimed round trips, then N timed ones.
//
// Output FILE: N lines, one per timed round trip in order, each the latency
// in microseconds as a decimal number with 3 decimals (e.g. "41.250"); no
// header, so numpy.loadtxt(FILE) reads it. Stdout: one summary line of
// key=value pairs:
//   client_bench mode=zrl steps=N warmup=W obs_dim=D request_bytes=B
//       median_us=.. p90_us=.. p99_us=.. mean_us=.. min_us=.. max_us=..
//       wall_s=.. steps_per_s=..
// Exit status: 0 on success, 1 on any error (a timeout included).
// Latencies come from std::chrono::steady_clock around each call.
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
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.h"

namespace {

using zrl::bench::act_frame_bytes;
using zrl::bench::micros;
using zrl::bench::percentile;

using Clock = std::chrono::steady_clock;

struct Args {
  std::string endpoint;
  int64_t steps = 0;
  int64_t warmup = 0;
  std::string out;
  std::string mode = "zrl";
  int64_t obs_dim = 4;
  int64_t actions = 2;
  int64_t timeout_ms = 10000;
};

[[noreturn]] void usage(const std::string& msg, int status = 1) {
  std::fprintf(stderr,
               "client_bench: %s\n"
               "usage: client_bench --endpoint E --steps N --warmup W --out FILE [--mode zrl|raw]\n"
               "                    [--obs-dim D] [--actions A] [--timeout-ms T]\n",
               msg.c_str());
  std::exit(status);
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") usage("times zrl::Client round trips", 0);
    if (i + 1 >= argc) usage("missing value for " + flag);
    const char* v = argv[++i];
    if (flag == "--endpoint") a.endpoint = v;
    else if (flag == "--steps") a.steps = zrl::bench::number_arg<int64_t>(flag, v, usage);
    else if (flag == "--warmup") a.warmup = zrl::bench::number_arg<int64_t>(flag, v, usage);
    else if (flag == "--out") a.out = v;
    else if (flag == "--mode") a.mode = v;
    else if (flag == "--obs-dim") a.obs_dim = zrl::bench::number_arg<int64_t>(flag, v, usage);
    else if (flag == "--actions") a.actions = zrl::bench::number_arg<int64_t>(flag, v, usage);
    else if (flag == "--timeout-ms") a.timeout_ms = zrl::bench::number_arg<int64_t>(flag, v, usage);
    else usage("unknown option " + flag);
  }
  if (a.endpoint.empty() || a.out.empty()) usage("--endpoint and --out are required");
  if (a.steps < 1 || a.warmup < 0) usage("--steps must be >= 1 and --warmup >= 0");
  if (a.mode != "zrl" && a.mode != "raw") usage("--mode is zrl or raw");
  if (a.obs_dim < 1 || a.actions < 1 || a.timeout_ms < 1) usage("--obs-dim, --actions, --timeout-ms must be >= 1");
  return a;
}


void run_zrl(const Args& a, std::vector<double>* latencies) {
  zrl::ClientOptions options;
  options.timeout = std::chrono::milliseconds(a.timeout_ms);
  options.name = "client_bench";
  zrl::Client client(a.endpoint, zrl::ObsSpec{{a.obs_dim}}, zrl::ActionSpec::discrete(a.actions), options);
  std::vector<float> obs(static_cast<std::size_t>(a.obs_dim), 0.0f);
  client.init(obs);
  int64_t in_episode = 0;
  for (int64_t i = 0; i < a.warmup + a.steps; ++i) {
    if (in_episode == 200) {
      client.reset(0.0f);
      client.init(obs);
      in_episode = 0;
    }
    obs[0] = static_cast<float>(i % 1000) * 1e-3f;
    const Clock::time_point t0 = Clock::now();
    client.send(0.0f, obs);
    const Clock::time_point t1 = Clock::now();
    ++in_episode;
    if (i >= a.warmup) latencies->push_back(micros(t1 - t0));
  }
  client.reset(0.0f);
  client.disconnect();
}

void run_raw(const Args& a, std::vector<double>* latencies) {
  void* ctx = zmq_ctx_new();
  void* sock = zmq_socket(ctx, ZMQ_DEALER);
  const int zero = 0;
  zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero));
  if (zmq_connect(sock, a.endpoint.c_str()) != 0) {
    throw std::runtime_error("cannot connect to " + a.endpoint + ": " + zmq_strerror(zmq_errno()));
  }
  std::vector<uint8_t> request(act_frame_bytes(a.obs_dim), 0);
  zmq_msg_t reply;
  zmq_msg_init(&reply);
  for (int64_t i = 0; i < a.warmup + a.steps; ++i) {
    request[0] = static_cast<uint8_t>(i);
    const Clock::time_point t0 = Clock::now();
    if (zmq_send(sock, request.data(), request.size(), 0) < 0) {
      throw std::runtime_error(std::string("send failed: ") + zmq_strerror(zmq_errno()));
    }
    zmq_pollitem_t item{sock, 0, ZMQ_POLLIN, 0};
    const int rc = zmq_poll(&item, 1, static_cast<long>(a.timeout_ms));
    if (rc <= 0) {
      throw std::runtime_error("no echo from " + a.endpoint + " within " + std::to_string(a.timeout_ms) + " ms");
    }
    do {
      if (zmq_msg_recv(&reply, sock, 0) < 0) {
        throw std::runtime_error(std::string("receive failed: ") + zmq_strerror(zmq_errno()));
      }
    } while (zmq_msg_more(&reply));
    const Clock::time_point t1 = Clock::now();
    if (i >= a.warmup) latencies->push_back(micros(t1 - t0));
  }
  zmq_msg_close(&reply);
  zmq_close(sock);
  zmq_ctx_term(ctx);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse_args(argc, argv);
  std::vector<double> latencies;
  latencies.reserve(static_cast<std::size_t>(a.steps));
  const Clock::time_point start = Clock::now();
  try {
    if (a.mode == "zrl") {
      run_zrl(a, &latencies);
    } else {
      run_raw(a, &latencies);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "client_bench: %s\n", e.what());
    return 1;
  }
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();

  FILE* f = std::fopen(a.out.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "client_bench: cannot write %s: %s\n", a.out.c_str(), std::strerror(errno));
    return 1;
  }
  for (double us : latencies) std::fprintf(f, "%.3f\n", us);
  if (std::fclose(f) != 0) {
    std::fprintf(stderr, "client_bench: cannot write %s\n", a.out.c_str());
    return 1;
  }

  std::vector<double> sorted = latencies;
  std::sort(sorted.begin(), sorted.end());
  const double timed = std::accumulate(sorted.begin(), sorted.end(), 0.0);
  std::printf(
      "client_bench mode=%s steps=%lld warmup=%lld obs_dim=%lld request_bytes=%llu median_us=%.2f p90_us=%.2f "
      "p99_us=%.2f mean_us=%.2f min_us=%.2f max_us=%.2f wall_s=%.3f steps_per_s=%.0f\n",
      a.mode.c_str(), static_cast<long long>(a.steps), static_cast<long long>(a.warmup),
      static_cast<long long>(a.obs_dim), static_cast<unsigned long long>(act_frame_bytes(a.obs_dim)),
      percentile(sorted, 0.5), percentile(sorted, 0.9), percentile(sorted, 0.99),
      timed / static_cast<double>(sorted.size()), sorted.front(), sorted.back(), wall,
      static_cast<double>(sorted.size()) / (timed * 1e-6));
  return 0;
}
