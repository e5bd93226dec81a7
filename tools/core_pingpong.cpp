// How far apart two CPUs are: the round trip of one cache line between a thread
// pinned to each, in ns. On a virtual machine the host decides where the vCPUs run,
// and that moves: on the 2-core Zen 4 EPYC guests here the round trip between CPU 0
// and CPU 1 was 50-100 ns in most runs and 330-390 ns in others (most likely the
// vCPUs on cores that share no L3), and in those the gradient all-reduce between
// the two ranks took 0.46-0.63 ms instead of 0.09. tools/bench_all prints it before
// every 2-rank run. A program that prints numbers, not a test:
//   build/core_pingpong [cpu_a cpu_b] [samples]
// Defaults: CPUs 0 and 1 (where mpirun binds ranks 0 and 1), 5 samples.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

constexpr int kTrips = 100000;  // round trips per sample: about 5 to 35 ms

alignas(64) std::atomic<int> ball{0};  // odd: on its way to the partner; even: back

bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int a = argc > 2 ? std::atoi(argv[1]) : 0;
  const int b = argc > 2 ? std::atoi(argv[2]) : 1;
  const int samples = std::max(1, argc == 2 ? std::atoi(argv[1]) : argc > 3 ? std::atoi(argv[3]) : 5);
  if (a == b) {  // the two threads would take turns on one core: a scheduler tick a trip
    std::fprintf(stderr, "core_pingpong: give two different CPUs, not %d and %d\n", a, b);
    return 1;
  }
  if (!pin(a)) {
    std::fprintf(stderr, "core_pingpong: cannot run on CPU %d\n", a);
    return 1;
  }
  std::atomic<bool> stop{false};
  std::atomic<int> partner{0};  // 1: pinned to b; -1: could not be
  std::thread thread([&] {
    partner = pin(b) ? 1 : -1;
    while (partner == 1 && !stop.load(std::memory_order_relaxed)) {
      const int v = ball.load(std::memory_order_acquire);
      if (v & 1) ball.store(v + 1, std::memory_order_release);
    }
  });
  while (partner == 0) std::this_thread::yield();
  if (partner < 0) {
    thread.join();
    std::fprintf(stderr, "core_pingpong: cannot run on CPU %d\n", b);
    return 1;
  }
  std::vector<double> ns;
  for (int s = 0; s < samples; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kTrips; ++i) {
      const int v = ball.load(std::memory_order_relaxed) + 1;
      ball.store(v, std::memory_order_release);
      while (ball.load(std::memory_order_acquire) == v) {
      }
    }
    ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
                 kTrips);
  }
  stop = true;
  thread.join();
  std::vector<double> sorted = ns;
  std::sort(sorted.begin(), sorted.end());
  std::printf("core_pingpong: CPU %d <-> CPU %d cache-line round trip %.0f ns (median of %d; %.0f-%.0f)\n", a,
              b, sorted[sorted.size() / 2], samples, sorted.front(), sorted.back());
  return 0;
}
