#include "train/signals.hpp"

#include <signal.h>

#include <cstring>
#include <ctime>

namespace ddp {

namespace {

volatile std::sig_atomic_t g_signal = 0;

// Runs only on a thread that unblocked the signals itself (none of ours does).
extern "C" void on_preemption_signal(int sig) { g_signal = sig; }

sigset_t preemption_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGTERM);
  return set;
}

// A pending SIGUSR1/SIGTERM of this process or thread, taken without waiting; 0 if none.
int take_pending() {
  const sigset_t set = preemption_signals();
  const timespec no_wait{0, 0};
  const int sig = sigtimedwait(&set, nullptr, &no_wait);
  return sig > 0 ? sig : 0;
}

}  // namespace

void install_preemption_handlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_preemption_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // MPI and file I/O calls resume rather than fail with EINTR
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  const sigset_t set = preemption_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int preemption_signal() {
  if (g_signal == 0) {
    if (const int sig = take_pending()) g_signal = sig;
  }
  return int(g_signal);
}

void clear_preemption() {
  while (take_pending() != 0) {
  }
  g_signal = 0;
}

}  // namespace ddp
