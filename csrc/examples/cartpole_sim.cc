// cartpole_sim — a simulator written in C++ that trains through zrl.
//
// This is the template to copy when you embed zrl in your own simulator.
// The simulator keeps its main loop; at each step it hands the observation
// (and the reward of the previous action) to a zrl::Client and gets back the
// action to apply. The agent server (`zrl serve`) runs the policy, records
// the experience and streams it to the learner; new weights reach the server
// while the simulator keeps stepping. Nothing here knows about the learning
// algorithm.
//
//   cartpole_sim --endpoint tcp://127.0.0.1:5557 [--envs K] [--episodes N]
//                [--max-seconds S] [--target R] [--seed S] [--timeout-ms T]
//
// K carts run in K threads, each with its own zrl::Client (a Client is not
// thread-safe; one per thread is the rule, and each is a separate session on
// the server). Every few seconds a progress line is printed. The program
// exits
//   0  once the mean return of the last 100 finished episodes (over all
//      carts) reaches --target (default 195, the classic "solved" bound);
//   2  when --max-seconds (default 600) pass or --episodes (default: no
//      limit) episodes finish first;
//   1  on an error (bad arguments, the server refusing the specs, ...).
//
// The physics is the classic cart-pole of Barto, Sutton & Anderson (1983) as
// in Gymnasium's CartPole-v1: Euler integration with tau = 0.02 s, the
// episode terminates when |x| > 2.4 or |theta| > 12 degrees and is truncated
// after 500 steps; reward 1 per step; initial state uniform in [-0.05, 0.05].
#include <zrl/client.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

// ---------------------------------------------------------------------------
// The simulator: nothing zrl-specific here.

class CartPole {
 public:
  static constexpr double kGravity = 9.8;
  static constexpr double kMassCart = 1.0;
  static constexpr double kMassPole = 0.1;
  static constexpr double kTotalMass = kMassCart + kMassPole;
  static constexpr double kLength = 0.5;  // half the pole's length
  static constexpr double kPoleMassLength = kMassPole * kLength;
  static constexpr double kForceMag = 10.0;
  static constexpr double kTau = 0.02;  // seconds per step
  static constexpr double kThetaLimit = 12.0 * 2.0 * 3.14159265358979323846 / 360.0;  // 12 degrees
  static constexpr double kXLimit = 2.4;
  static constexpr int kMaxSteps = 500;

  explicit CartPole(uint64_t seed) : rng_(seed) {}

  // Starts an episode; returns the first observation.
  const std::vector<float>& reset() {
    std::uniform_real_distribution<double> u(-0.05, 0.05);
    x_ = u(rng_);
    x_dot_ = u(rng_);
    theta_ = u(rng_);
    theta_dot_ = u(rng_);
    steps_ = 0;
    return observe();
  }

  struct Step {
    const std::vector<float>& obs;
    float reward;
    bool terminated;  // the pole fell or the cart left the track
    bool truncated;   // the time limit (500 steps) cut the episode
  };

  // action 1 pushes right, 0 pushes left.
  Step step(int64_t action) {
    const double force = action == 1 ? kForceMag : -kForceMag;
    const double cos_t = std::cos(theta_);
    const double sin_t = std::sin(theta_);
    const double temp = (force + kPoleMassLength * theta_dot_ * theta_dot_ * sin_t) / kTotalMass;
    const double theta_acc =
        (kGravity * sin_t - cos_t * temp) / (kLength * (4.0 / 3.0 - kMassPole * cos_t * cos_t / kTotalMass));
    const double x_acc = temp - kPoleMassLength * theta_acc * cos_t / kTotalMass;
    x_ += kTau * x_dot_;
    x_dot_ += kTau * x_acc;
    theta_ += kTau * theta_dot_;
    theta_dot_ += kTau * theta_acc;
    ++steps_;
    const bool terminated = x_ < -kXLimit || x_ > kXLimit || theta_ < -kThetaLimit || theta_ > kThetaLimit;
    const bool truncated = !terminated && steps_ >= kMaxSteps;
    return Step{observe(), 1.0f, terminated, truncated};
  }

 private:
  const std::vector<float>& observe() {
    obs_ = {static_cast<float>(x_), static_cast<float>(x_dot_), static_cast<float>(theta_),
            static_cast<float>(theta_dot_)};
    return obs_;
  }

  std::mt19937_64 rng_;
  double x_ = 0, x_dot_ = 0, theta_ = 0, theta_dot_ = 0;
  int steps_ = 0;
  std::vector<float> obs_;
};

// ---------------------------------------------------------------------------
// Command line

struct Args {
  std::string endpoint;
  int envs = 1;
  int64_t episodes = 0;  // 0: no limit
  double max_seconds = 600.0;
  double target = 195.0;
  uint64_t seed = 0;
  int64_t timeout_ms = 10000;
};

[[noreturn]] void usage(const char* msg, int status = 1) {
  std::fprintf(stderr,
               "cartpole_sim: %s\n"
               "usage: cartpole_sim --endpoint tcp://HOST:PORT [--envs K] [--episodes N] [--max-seconds S]\n"
               "                    [--target R] [--seed S] [--timeout-ms T]\n",
               msg);
  std::exit(status);
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") usage("trains CartPole through a zrl agent server", 0);
    if (i + 1 >= argc) usage(("missing value for " + flag).c_str());
    const char* v = argv[++i];
    char* end = nullptr;
    errno = 0;
    if (flag == "--endpoint") {
      a.endpoint = v;
      continue;
    } else if (flag == "--envs") {
      a.envs = static_cast<int>(std::strtol(v, &end, 10));
    } else if (flag == "--episodes") {
      a.episodes = std::strtoll(v, &end, 10);
    } else if (flag == "--max-seconds") {
      a.max_seconds = std::strtod(v, &end);
    } else if (flag == "--target") {
      a.target = std::strtod(v, &end);
    } else if (flag == "--seed") {
      a.seed = std::strtoull(v, &end, 10);
    } else if (flag == "--timeout-ms") {
      a.timeout_ms = std::strtoll(v, &end, 10);
    } else {
      usage(("unknown option " + flag).c_str());
    }
    if (end == v || *end != '\0' || errno != 0) usage(("bad value for " + flag + ": " + v).c_str());
  }
  if (a.endpoint.empty()) usage("--endpoint is required");
  if (a.envs < 1 || a.envs > 1024) usage("--envs must be in [1, 1024]");
  if (a.episodes < 0 || a.max_seconds <= 0 || a.timeout_ms <= 0) usage("counts and times must be positive");
  return a;
}

// ---------------------------------------------------------------------------
// What the carts share: finished episodes and the stop signal. The carts
// only touch it between episodes, so one mutex is plenty.

using Clock = std::chrono::steady_clock;

struct Progress {
  std::mutex mu;
  std::condition_variable changed;
  std::deque<double> last_returns;  // the last 100 episodes, all carts together
  int64_t episodes = 0;
  int64_t steps = 0;
  int64_t timeouts = 0;
  uint64_t policy_version = 0;
  std::string error;  // set by a cart that hit an error it cannot recover from
  std::atomic<bool> stop{false};

  double mean_return() const {  // caller holds mu
    if (last_returns.empty()) return 0.0;
    double s = 0;
    for (double r : last_returns) s += r;
    return s / static_cast<double>(last_returns.size());
  }
};

// Plays one episode; returns false if asked to stop half-way.
bool play_episode(zrl::Client& client, CartPole& cart, const Progress& progress, double* episode_return,
                  int64_t* steps) {
  // An episode: init() with the first observation, send() per step with the
  // reward of the previous action, reset() at the end. reset() says why the
  // episode ended: terminated (the pole fell: nothing to bootstrap from) or
  // truncated by the time limit, where the learner needs the final
  // observation to estimate what would have followed.
  zrl::Action action = client.init(cart.reset());
  for (;;) {
    const CartPole::Step s = cart.step(action.index());
    ++*steps;
    if (s.terminated) {
      *episode_return = client.reset(s.reward);
      return true;
    }
    if (s.truncated) {
      *episode_return = client.reset(s.reward, /*truncated=*/true, s.obs);
      return true;
    }
    action = client.send(s.reward, s.obs);
    if (progress.stop.load()) return false;
  }
}

// One cart, one thread, one zrl::Client.
void run_cart(const Args& args, int index, Progress* progress) {
  try {
    CartPole cart(args.seed * 1000003u + static_cast<uint64_t>(index));

    // The specs must match the server's config (configs/cartpole_serve.yaml):
    // 4 float32 values in, one of 2 actions out. The name shows in its logs.
    zrl::ClientOptions options;
    options.timeout = std::chrono::milliseconds(args.timeout_ms);
    options.name = "cartpole_sim/" + std::to_string(index);
    zrl::Client client(args.endpoint, zrl::ObsSpec{{4}, zrl::ObsDType::kFloat32}, zrl::ActionSpec::discrete(2),
                       options);

    while (!progress->stop.load()) {
      double episode_return = 0;
      int64_t steps = 0;
      try {
        if (!play_episode(client, cart, *progress, &episode_return, &steps)) return;  // ~Client says BYE
      } catch (const zrl::TimeoutError& e) {
        // The server did not answer in time: it may be restarting. The client
        // has already closed its socket; the next init() reconnects and says
        // hello again. The episode is lost, so start a new one.
        std::fprintf(stderr, "cart %d: %s\n", index, e.what());
        std::lock_guard<std::mutex> lock(progress->mu);
        ++progress->timeouts;
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(progress->mu);
        progress->last_returns.push_back(episode_return);
        if (progress->last_returns.size() > 100) progress->last_returns.pop_front();
        ++progress->episodes;
        progress->steps += steps;
        progress->policy_version = std::max(progress->policy_version, client.policy_version());
        progress->changed.notify_all();
      }
      // Anything else worth plotting goes to TensorBoard as custom/<name>.
      // Fire and forget: no reply is awaited.
      try {
        client.metrics().scalar("cartpole_steps", static_cast<double>(steps));
      } catch (const zrl::TimeoutError&) {
        // Only possible when the hello is due again; the next init() retries.
      }
    }
  } catch (const zrl::Error& e) {
    // ServerError (e.g. the specs do not match the server's config),
    // ProtocolError, UsageError: retrying would fail the same way.
    std::lock_guard<std::mutex> lock(progress->mu);
    if (progress->error.empty()) progress->error = "cart " + std::to_string(index) + ": " + e.what();
    progress->stop = true;
    progress->changed.notify_all();
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  std::printf("cartpole_sim: %d cart(s) -> %s, target mean return %.1f over 100 episodes, zrl client %s\n",
              args.envs, args.endpoint.c_str(), args.target, zrl::client_version());
  std::fflush(stdout);

  Progress progress;
  std::vector<std::thread> carts;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(args.max_seconds));
  for (int k = 0; k < args.envs; ++k) carts.emplace_back(run_cart, std::cref(args), k, &progress);

  // The main thread only watches: it wakes when an episode ends, prints a
  // line every 2 seconds and decides when to stop.
  int rc = 2;
  std::string outcome;
  Clock::time_point next_print = start + std::chrono::seconds(2);
  {
    std::unique_lock<std::mutex> lock(progress.mu);
    for (;;) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      if (!progress.error.empty()) {
        outcome = "error: " + progress.error;
        rc = 1;
        break;
      }
      if (progress.last_returns.size() >= 100 && progress.mean_return() >= args.target) {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "solved: mean return %.1f over the last 100 episodes after %lld episodes, %.1f s",
                      progress.mean_return(), static_cast<long long>(progress.episodes), elapsed);
        outcome = buf;
        rc = 0;
        break;
      }
      if (args.episodes > 0 && progress.episodes >= args.episodes) {
        outcome = "gave up: " + std::to_string(progress.episodes) + " episodes without reaching the target";
        break;
      }
      if (Clock::now() >= deadline) {
        outcome = "gave up: --max-seconds passed without reaching the target";
        break;
      }
      if (Clock::now() >= next_print) {
        std::printf("episodes %lld  steps %lld  mean return (last %zu) %.1f  policy version %llu  timeouts %lld  %.0f s\n",
                    static_cast<long long>(progress.episodes), static_cast<long long>(progress.steps),
                    progress.last_returns.size(), progress.mean_return(),
                    static_cast<unsigned long long>(progress.policy_version),
                    static_cast<long long>(progress.timeouts), elapsed);
        std::fflush(stdout);
        next_print += std::chrono::seconds(2);
      }
      progress.changed.wait_until(lock, std::min(next_print, deadline));
    }
  }
  progress.stop = true;
  // A cart blocked in a call returns within its timeout; its Client says BYE.
  for (std::thread& t : carts) t.join();
  std::printf("cartpole_sim: %s\n", outcome.c_str());
  return rc;
}
