#include "train/signals.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "comm/log.hpp"

namespace ddp {

namespace {

volatile std::sig_atomic_t g_signal = 0;

// Runs only on a thread that unblocked the signals itself (none of ours does).
extern "C" void on_preemption_signal(int sig) { g_signal = sig; }

// exit_on_sigterm's: the status and the line, both set before the handler is installed.
int g_exit_status = 0;
char g_exit_line[160];
std::size_t g_exit_line_size = 0;

// Only async-signal-safe calls: write and _exit.
extern "C" void exit_at_once(int) {
  if (write(STDERR_FILENO, g_exit_line, g_exit_line_size) < 0) {
    // nothing to do about it: the exit status says the same
  }
  _exit(g_exit_status);
}

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

void exit_on_sigterm(int status) {
  preemption_signal();  // takes this rank's own stop request if it is still pending
  g_exit_status = status;
  const int n =
      std::snprintf(g_exit_line, sizeof g_exit_line,
                    "rank %d: SIGTERM after the stop's checkpoint: exit %d now\n", log::rank(), status);
  g_exit_line_size = n > 0 ? std::min(std::size_t(n), sizeof g_exit_line - 1) : 0;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = exit_at_once;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_UNBLOCK, &term, nullptr);  // a SIGTERM pending since the stop is delivered here
}

void clear_preemption() {
  while (take_pending() != 0) {
  }
  g_signal = 0;
}

}  // namespace ddp
