#include "comm/watchdog.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/check.hpp"
#include "comm/log.hpp"

namespace ddp {

namespace {

using Clock = std::chrono::steady_clock;

// A rank's heartbeat, five int64 in its own memory of the window: collectives
// entered, step, phase (the training thread writes them), a tick that the rank's
// watchdog thread advances every 100 ms, which tells a waiting rank from a stopped one,
// and the milliseconds since the training thread last moved on (progress(), a phase
// entered), which the watchdog thread writes with each tick.
enum Field { kEntered = 0, kStep = 1, kPhase = 2, kTick = 3, kIdleMs = 4, kFields = 5 };

// Where set_step/set_phase/Collective write: the window once a Watchdog runs.
std::int64_t g_fallback[kFields] = {0, 0, 0, 0, 0};
std::atomic<std::int64_t> g_progress{0};  // progress() calls and phases entered, counted
std::atomic<std::int64_t*> g_slot{g_fallback};
std::atomic<const char*> g_what{""};
std::atomic<std::int64_t> g_during{0};    // the phase the collective was entered from
std::atomic<bool> g_file_system{false};   // the collective waits on the file system too
std::atomic<std::int64_t> g_since_ns{0};  // Clock time of entering the collective; 0: in none

std::int64_t load(int field) { return __atomic_load_n(&g_slot.load(std::memory_order_relaxed)[field], __ATOMIC_RELAXED); }
void store(int field, std::int64_t v) {
  __atomic_store_n(&g_slot.load(std::memory_order_relaxed)[field], v, __ATOMIC_RELAXED);
}
// This rank's watchdog thread is alive: every 100 ms, also while it reads the others.
void tick() { store(kTick, load(kTick) + 1); }
std::int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

const char* phase_name(std::int64_t p) {
  switch (Phase(p)) {
    case Phase::setup: return "setup";
    case Phase::data: return "data reading";
    case Phase::compute: return "compute";
    case Phase::collective: return "a collective";
    case Phase::checkpoint: return "a checkpoint";
    case Phase::validation: return "validation";
    case Phase::done: return "the end of the run";
    case Phase::failing: return "ending the job";
  }
  return "an unknown phase";
}

struct State {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Win win = MPI_WIN_NULL;
  int rank = 0, size = 1;
  double timeout_s = 0;
  bool thread_multiple = false;
  std::string no_window;  // why there is no window (win == MPI_WIN_NULL), for the hang report
  std::thread thread;
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
};
State* g_state = nullptr;  // never deleted: a job that exits from elsewhere leaves it

// The heartbeats of every rank, read without their help; false where a rank did not
// answer within `deadline_s`.
std::vector<bool> read_heartbeats(State& s, std::vector<std::int64_t>& beats, double deadline_s) {
  beats.assign(std::size_t(s.size) * kFields, 0);
  std::vector<MPI_Request> req(std::size_t(s.size), MPI_REQUEST_NULL);
  std::vector<bool> answered(std::size_t(s.size), false);
  for (int r = 0; r < s.size; ++r) {
    if (r == s.rank) {
      for (int f = 0; f < kFields; ++f) beats[std::size_t(r * kFields + f)] = load(f);
      answered[std::size_t(r)] = true;
    } else if (MPI_Rget(&beats[std::size_t(r * kFields)], kFields, MPI_INT64_T, r, 0, kFields, MPI_INT64_T, s.win,
                        &req[std::size_t(r)]) != MPI_SUCCESS) {
      req[std::size_t(r)] = MPI_REQUEST_NULL;
    }
  }
  const auto until = Clock::now() + std::chrono::duration<double>(deadline_s);
  for (bool pending = true; pending && Clock::now() < until;) {
    pending = false;
    for (int r = 0; r < s.size; ++r) {
      if (r == s.rank || answered[std::size_t(r)] || req[std::size_t(r)] == MPI_REQUEST_NULL) continue;
      int done = 0;
      if (MPI_Test(&req[std::size_t(r)], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done)
        answered[std::size_t(r)] = true;
      else
        pending = true;
    }
    if (pending) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    tick();
  }
  return answered;  // requests still pending are left: the job is about to end
}

// Data reading and a checkpoint are where a rank reads or writes what the others
// wait for, and says so as it moves on (progress()).
bool moves_on_in(std::int64_t phase) {
  return Phase(phase) == Phase::data || Phase(phase) == Phase::checkpoint;
}

// This rank has waited `waited_s` in the collective it entered at `entered_ns`. Ends
// the job, or returns when another waiting rank is the one to end it or the
// collective has completed meanwhile (0), or when every rank not arrived is reading
// or writing and has moved on within comm.timeout_s: then the seconds after which
// the first of them will not have moved for that long, to look again.
//
// Who is to blame is read from the heartbeats twice, a second apart: a rank that does
// not answer, or whose tick does not move, is not running (stopped, or its node is
// gone); a running rank outside any collective is stuck where it is (compute, data
// reading, a checkpoint), unless it is moving on. Running ranks inside a collective
// wait, like this one: a rank may wait in an earlier collective than this one's, for
// the same culprit.
double on_hang(State& s, std::int64_t entered_ns, double waited_s, double grace_s) {
  const std::int64_t step = load(kStep);
  char head[512];
  std::snprintf(head, sizeof head, "waited %.0f s (comm.timeout_s = %g) in %s (during %s) at step %lld", waited_s,
                s.timeout_s, g_what.load(), phase_name(g_during.load()), (long long)step);
  if (!s.thread_multiple)
    fatal_as("hang", std::string(head) + "; which ranks have not arrived is unknown (MPI without MPI_THREAD_MULTIPLE)");
  if (s.win == MPI_WIN_NULL)
    fatal_as("hang", std::string(head) + "; which ranks have not arrived is unknown (no MPI one-sided window: " +
                         s.no_window + ")");

  std::vector<std::int64_t> first, beats;
  const std::vector<bool> answered_first = read_heartbeats(s, first, 2.0);
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    tick();
  }
  const std::vector<bool> answered = read_heartbeats(s, beats, 2.0);
  std::vector<int> waiting;
  std::string missing;
  bool all_moving_on = true;  // every rank not arrived is reading or writing, and moves on
  bool ending = false;        // another rank has printed its line and is ending the job
  double look_again_s = s.timeout_s;
  for (int r = 0; r < s.size; ++r) {
    const std::int64_t* b = &beats[std::size_t(r * kFields)];
    if (r != s.rank && answered[std::size_t(r)] && Phase(b[kPhase]) == Phase::failing) ending = true;
    const bool running = r == s.rank || (answered[std::size_t(r)] && answered_first[std::size_t(r)] &&
                                         b[kTick] != first[std::size_t(r * kFields + kTick)]);
    char one[200] = "";
    if (!answered[std::size_t(r)])
      std::snprintf(one, sizeof one, "rank %d (no answer: stopped, or its node is gone)", r);
    else if (!running)
      std::snprintf(one, sizeof one, "rank %d (not running: stopped, or its node is gone; last in %s at step %lld)", r,
                    phase_name(b[kPhase]), (long long)b[kStep]);
    else if (Phase(b[kPhase]) != Phase::collective)
      std::snprintf(one, sizeof one, "rank %d (in %s at step %lld)", r, phase_name(b[kPhase]), (long long)b[kStep]);
    else
      waiting.push_back(r);
    if (!one[0]) continue;
    missing += (missing.empty() ? "" : ", ") + std::string(one);
    const double idle_s = double(b[kIdleMs]) * 1e-3;
    if (running && moves_on_in(b[kPhase]) && idle_s < s.timeout_s)
      look_again_s = std::min(look_again_s, s.timeout_s - idle_s);
    else
      all_moving_on = false;
  }
  // A rank that reported (this hang, or an error of its own) stops ticking while its
  // abort hooks (ncclCommAbort, up to kAbortHooksS) and its MPI_Abort end the job: not
  // a second line for it, unless the job outlives that.
  if (ending && waited_s < s.timeout_s + 2 * grace_s + kAbortHooksS) return 1.0;
  if (!missing.empty() && all_moving_on) return std::max(look_again_s, 0.1);  // slow, not stuck
  // The lowest waiting rank reports at once; the others give it `grace_s`.
  if (!waiting.empty() && waiting.front() != s.rank && waited_s < s.timeout_s + grace_s) return 0;
  if (g_since_ns.load(std::memory_order_relaxed) != entered_ns)
    return 0;  // it completed meanwhile: slow, not hung
  std::string msg = head;
  if (missing.empty() && g_file_system.load(std::memory_order_relaxed))
    msg +=
        "; every rank is running and waits in it: on some rank a call to the file system inside it has not "
        "returned (a file system that stopped answering)";
  else if (missing.empty())
    msg += "; every rank is running and waits in a collective: the collectives do not match, or the network "
           "does not deliver";
  else
    msg += "; not arrived: " + missing;
  msg += "; waiting: " + std::string(waiting.size() > 1 ? "ranks " : "rank ") + log::ranks_text(waiting);
  fatal_as("hang", msg);
  return 0;
}

void watch(State& s) {
  const double grace_s = 5.0;
  std::int64_t last = now_ns(), resumed = 0;
  std::int64_t progress = g_progress.load(std::memory_order_relaxed), moved_on = last;
  std::int64_t looked_in = 0, look_again = 0;  // the collective a look was put off in, and until when
  std::unique_lock<std::mutex> lock(s.mutex);
  while (!s.stop) {
    s.wake.wait_for(lock, std::chrono::milliseconds(100));
    tick();
    const std::int64_t t = now_ns();
    if (const std::int64_t p = g_progress.load(std::memory_order_relaxed); p != progress) {
      progress = p;
      moved_on = t;
    }
    store(kIdleMs, (t - moved_on) / 1'000'000);
    // A gap of seconds between ticks: this process was stopped (or starved), and a
    // launcher that resumes it to kill it must not hear it report its own stop.
    if (t - last > 2'000'000'000) resumed = t;
    last = t;
    const std::int64_t entered = g_since_ns.load(std::memory_order_relaxed);  // read once: it changes under us
    if (s.stop || entered == 0 || (entered == looked_in && t < look_again)) continue;
    const double waited_s = double(t - std::max(entered, resumed)) * 1e-9;
    if (waited_s < s.timeout_s) continue;
    const double later_s = on_hang(s, entered, waited_s, grace_s);
    looked_in = entered;
    look_again = now_ns() + std::int64_t(later_s * 1e9);
  }
}

}  // namespace

Watchdog::Watchdog(MPI_Comm comm, double timeout_s, bool thread_multiple) {
  if (timeout_s <= 0) return;
  auto* s = new State;
  MPI_CHECK(MPI_Comm_dup(comm, &s->comm));
  MPI_CHECK(MPI_Comm_rank(s->comm, &s->rank));
  MPI_CHECK(MPI_Comm_size(s->comm, &s->size));
  s->timeout_s = timeout_s;
  s->thread_multiple = thread_multiple;
  // Open MPI 4.1 across nodes over its TCP transport has no one-sided component for
  // MPI_THREAD_MULTIPLE (osc/rdma wants RDMA hardware, osc/pt2pt refuses the thread
  // level): there the heartbeats stay local and a hang is named without its ranks.
  std::int64_t* base = nullptr;
  const int rc = MPI_Win_allocate(MPI_Aint(kFields * sizeof(std::int64_t)), int(sizeof(std::int64_t)),
                                  MPI_INFO_NULL, s->comm, &base, &s->win);
  int ok = rc == MPI_SUCCESS, all_ok = 0;
  MPI_CHECK(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, s->comm));
  if (all_ok) {
    for (int f = 0; f < kFields; ++f) base[f] = g_fallback[f];
    g_slot.store(base);
    // One passive epoch for the whole run: reads need no lock round trip, and no
    // target's help.
    MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, s->win));
  } else {
    // A window that some ranks made is left, not freed: freeing is collective.
    s->win = MPI_WIN_NULL;
    s->no_window = rc == MPI_SUCCESS ? "another rank's MPI_Win_allocate failed" : mpi_error_string(rc);
    log::info("watchdog: no MPI one-sided window across these ranks (" + s->no_window +
              "): a hang will be named by its collective and step, not by the ranks that did not arrive");
  }
  s->thread = std::thread(watch, std::ref(*s));
  g_state = s;
}

Watchdog::~Watchdog() {
  State* s = g_state;
  if (!s) return;
  watchdog::stop();
  if (s->win != MPI_WIN_NULL) {
    MPI_Win_unlock_all(s->win);
    MPI_Win_free(&s->win);
  }
  MPI_Comm_free(&s->comm);
  g_state = nullptr;
  delete s;
}

namespace watchdog {

void stop() {
  State* s = g_state;
  if (!s || !s->thread.joinable() || s->thread.get_id() == std::this_thread::get_id()) return;
  {
    std::lock_guard<std::mutex> lock(s->mutex);
    s->stop = true;
  }
  s->wake.notify_all();
  s->thread.join();
  for (int f = 0; f < kFields; ++f) g_fallback[f] = load(f);
  g_slot.store(g_fallback);
}

bool running() {
  const State* s = g_state;
  return s && s->thread.joinable();
}

void set_step(std::int64_t step) { store(kStep, step); }
void set_phase(Phase phase) {
  store(kPhase, std::int64_t(phase));
  progress();
}
void progress() { g_progress.fetch_add(1, std::memory_order_relaxed); }

During::During(Phase phase) : before_(Phase(load(kPhase))) { set_phase(phase); }

During::~During() { store(kPhase, std::int64_t(before_)); }

Collective::Collective(const char* what, Through through) : before_(Phase(load(kPhase))) {
  store(kEntered, load(kEntered) + 1);  // only this thread writes it
  store(kPhase, std::int64_t(Phase::collective));
  g_what.store(what, std::memory_order_relaxed);
  g_file_system.store(through == Through::file_system, std::memory_order_relaxed);
  g_during.store(std::int64_t(before_), std::memory_order_relaxed);
  g_since_ns.store(now_ns(), std::memory_order_relaxed);
}

Collective::~Collective() {
  g_since_ns.store(0, std::memory_order_relaxed);
  store(kPhase, std::int64_t(before_));
}

}  // namespace watchdog

}  // namespace ddp
