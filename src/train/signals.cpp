#include "train/signals.hpp"

#include <cstring>

namespace ddp {

namespace {

volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_preemption_signal(int sig) { g_signal = sig; }

}  // namespace

void install_preemption_handlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_preemption_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // MPI and file I/O calls resume rather than fail with EINTR
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int preemption_signal() { return int(g_signal); }

void clear_preemption() { g_signal = 0; }

}  // namespace ddp
