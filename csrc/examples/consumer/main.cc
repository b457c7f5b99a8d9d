// Links against an installed libzrl_client and uses it: no server listens on
// the endpoint, so init() must time out, and the zrl::TimeoutError thrown
// inside the library must be caught here by its type (which checks that the
// exception types are exported from the shared library). Exits 0 on success.
#include <zrl/client.h>

#include <chrono>
#include <cstdio>
#include <vector>

int main() {
  zrl::ClientOptions options;
  options.timeout = std::chrono::milliseconds(100);
  options.name = "consumer";
  // inproc:// connects without a peer and never leaves the process.
  zrl::Client client("inproc://zrl-consumer-nobody", zrl::ObsSpec{{4}}, zrl::ActionSpec::discrete(2), options);
  const std::vector<float> obs = {0.0f, 0.0f, 0.0f, 0.0f};
  try {
    client.init(obs);
  } catch (const zrl::TimeoutError& e) {
    std::printf("consumer: zrl client %s works: %s\n", zrl::client_version(), e.what());
    return 0;
  } catch (const zrl::Error& e) {
    std::printf("consumer: unexpected zrl::Error: %s\n", e.what());
    return 1;
  }
  std::printf("consumer: init() returned without a server\n");
  return 1;
}
