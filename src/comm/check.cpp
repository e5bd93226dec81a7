#include "comm/check.hpp"

#include <cxxabi.h>
#include <hdf5.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <typeinfo>
#include <utility>
#include <vector>

#include "comm/fault_injection.hpp"
#include "comm/mpi_wait.hpp"
#include "comm/watchdog.hpp"

namespace ddp {

namespace {
bool mpi_active() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

int world_rank() {
  int rank = 0;
  if (mpi_active()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

[[noreturn]] void abort_all(int code) {
  if (mpi_active()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

// The user reads one line per failure: a message with newlines in it (Kokkos's
// allocation failure has three) is joined, and the traceback Kokkos appends to the
// exceptions it throws ("Traceback functionality not available", or "Backtrace:"
// and frames when Kokkos was built with them) is cut: it is a stack dump.
std::string one_line(std::string msg) {
  for (const char* tail : {"\nTraceback functionality", "\nBacktrace:"}) {
    const std::size_t at = msg.find(tail);
    if (at != std::string::npos) msg.erase(at);
  }
  std::string out;
  for (char c : msg) {
    const bool space = c == ' ' || c == '\n' || c == '\r' || c == '\t';
    if (!space)
      out += c;
    else if (!out.empty() && out.back() != ' ')
      out += ' ';
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// Set by the first failure of this process. Two threads may fail at once (the
// prefetch thread and the main thread); the user gets the first one's line.
std::atomic<bool> g_failing{false};
MPI_Comm g_exit_comm = MPI_COMM_NULL;  // make_exit_communicator()

thread_local bool t_capturing = false;

std::mutex g_hooks_mutex;
std::vector<std::pair<AbortHook, void*>>& hooks() {
  static auto* h = new std::vector<std::pair<AbortHook, void*>>;  // never freed: a fatal may come at exit
  return *h;
}

// The hooks on a thread of their own, waited for kAbortHooksS at most: one that blocks (an
// ncclCommAbort on a communicator whose peer is gone) must not keep the job alive.
// That thread holds the hooks' lock while they run, so a remove_abort_hook (the
// communicator's destructor) waits for a hook under way before its object goes.
void run_abort_hooks() {
  {
    const std::lock_guard<std::mutex> lock(g_hooks_mutex);
    if (hooks().empty()) return;
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread([done] {
    const std::lock_guard<std::mutex> lock(g_hooks_mutex);
    for (const auto& [hook, arg] : hooks()) hook(arg);
    hooks().clear();
    done->store(true);
  }).detach();
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                             std::chrono::duration<double>(kAbortHooksS));
  while (!done->load() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

[[noreturn]] void fail(const std::string& what, const std::string& msg_in) {
  const std::string msg =
      t_capturing ? msg_in +
                        " (while capturing the training step as a CUDA graph; train.cuda_graph = 'off' "
                        "runs without one)"
                  : msg_in;
  if (g_failing.exchange(true)) {
    // The first failure is in MPI_Abort, which ends this process too.
    std::this_thread::sleep_for(std::chrono::seconds(30));
    std::_Exit(1);
  }
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  std::fprintf(stderr, "rank %d (%s): %s: %s\n", world_rank(), host, what.c_str(), one_line(msg).c_str());
  std::fflush(stderr);
  watchdog::set_phase(Phase::failing);  // the other ranks' watchdogs: this line is the job's
  run_abort_hooks();
  inject_abort_delay();  // tests only: a slow end
  abort_all(1);
}

std::string type_name(const std::type_info* type) {
  if (!type) return "exception of unknown type";
  int status = 0;
  char* name = abi::__cxa_demangle(type->name(), nullptr, nullptr, &status);
  std::string s = status == 0 && name ? name : type->name();
  std::free(name);
  return s;
}

std::thread::id g_main_thread;

// An exception that no handler catches ends here with the stack intact: with no
// matching catch, the C++ runtime calls std::terminate before unwinding anything
// (Itanium ABI: GCC, Clang). That is why main has no catch-all: unwinding to it runs
// the destructors, and a ShardDataset's H5Fclose ends in MPI_File_close, which waits
// in a barrier for the other ranks while they wait in the gradient all-reduce for
// this one. Tried: a job with a catch in main hung there until killed.
[[noreturn]] void on_terminate() {
  std::string what = "std::terminate called", msg = "no exception in flight";
  if (std::current_exception()) {
    what = "uncaught " + type_name(abi::__cxa_current_exception_type());
    try {
      throw;
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
      msg = "not a std::exception: no message";
    }
  }
  if (std::this_thread::get_id() != g_main_thread) what += " on a worker thread";
  fail(what, msg);
}

// Every rank of `comm` is here (a collective error): leave through MPI_Finalize, so
// the launcher sees ranks that ended with status 1, not an abort (no abort banner).
[[noreturn]] void exit_together(MPI_Comm comm, int code) {
  std::fflush(nullptr);  // rank 0's log lines on stdout come before the exit
  int size = 1, world_size = 1;
  MPI_Comm_size(comm, &size);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  // MPI_Finalize waits for every rank of the job; if one does not come (the error
  // was not collective after all, or comm is not the whole job), abort instead of
  // hanging. The ranks reach this point within milliseconds of each other: they
  // found the error through the same collective call.
  bool all_here = size == world_size;
  MPI_Request request = MPI_REQUEST_NULL;
  // On a communicator of its own: a rank still in another collective on `comm` (a
  // nonblocking one, mpi_wait.hpp) could match a barrier there and pass for here.
  const MPI_Comm here = g_exit_comm != MPI_COMM_NULL ? g_exit_comm : comm;
  if (all_here && MPI_Ibarrier(here, &request) == MPI_SUCCESS) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    int done = 0;
    while (!done && std::chrono::steady_clock::now() < deadline) {
      if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    all_here = done != 0;
  }
  if (!all_here) abort_all(code);  // rank 0's `error:` line is out already
  // The watchdog's thread writes into window memory that MPI_Finalize frees.
  watchdog::stop();
  // No unwinding and no Kokkos::finalize: nothing needs to outlive the process, and
  // the Views still alive would be freed after it. HDF5 closes its files inside
  // MPI_Finalize (H5_term_library, from its MPI_COMM_SELF attribute), on every rank
  // alike, so a shard file open with MPI-IO is closed collectively.
  MPI_Finalize();
  std::fflush(nullptr);
  std::_Exit(code);
}
}  // namespace

CaptureScope::CaptureScope() { t_capturing = true; }
CaptureScope::~CaptureScope() { t_capturing = false; }

void fatal(const char* file, int line, const std::string& msg) {
  fail(std::string(file) + ":" + std::to_string(line), msg);
}

void fatal_as(const std::string& what, const std::string& msg) { fail(what, msg); }

void add_abort_hook(AbortHook hook, void* arg) {
  const std::lock_guard<std::mutex> lock(g_hooks_mutex);
  hooks().emplace_back(hook, arg);
}

void remove_abort_hook(AbortHook hook, void* arg) {
  const std::lock_guard<std::mutex> lock(g_hooks_mutex);
  auto& h = hooks();
  for (auto it = h.begin(); it != h.end();)
    it = it->first == hook && it->second == arg ? h.erase(it) : it + 1;
}

void make_exit_communicator() {
  if (g_exit_comm == MPI_COMM_NULL) MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g_exit_comm));
}

void install_terminate_handler() {
  g_main_thread = std::this_thread::get_id();
  std::set_terminate(on_terminate);
}

void fatal_all(MPI_Comm comm, const std::string& msg, bool say) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0 && say) {
    std::fprintf(stderr, "error: %s\n", msg.c_str());
    std::fflush(stderr);
  }
  exit_together(comm, 1);
}

void fatal_if_any(MPI_Comm comm, bool failed, const std::string& msg) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int mine = failed ? rank : size, first = size;
  {
    const watchdog::Collective guard("the agreement that no rank failed (MPI_Allreduce)");
    MPI_CHECK(allreduce_waiting(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
  }
  if (first == size) return;
  if (rank == first) {
    std::fprintf(stderr, "error: %s%s\n", size > 1 ? ("rank " + std::to_string(rank) + ": ").c_str() : "",
                 msg.c_str());
    std::fflush(stderr);
  }
  exit_together(comm, 1);
}

std::string first_words(MPI_Comm comm, const std::string& mine) {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  int me = mine.empty() ? size : rank, first = size;
  {
    const watchdog::Collective guard("the agreement on which rank speaks (MPI_Allreduce)");
    MPI_CHECK(allreduce_waiting(&me, &first, 1, MPI_INT, MPI_MIN, comm));
  }
  if (first == size) return "";
  std::string text = rank == first ? mine : "";
  int len = int(text.size());
  MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT, first, comm));
  text.resize(std::size_t(len));
  MPI_CHECK(MPI_Bcast(text.data(), len, MPI_CHAR, first, comm));
  return text;
}

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, len);
}

namespace {
herr_t innermost(unsigned n, const H5E_error2_t* err, void* out) {
  if (n == 0) {
    auto* s = static_cast<std::string*>(out);
    *s = std::string(err->func_name) + ": " + (err->desc ? err->desc : "");
  }
  return 0;
}
}  // namespace

std::string h5_error_string() {
  std::string s = "HDF5 error";
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, &s);
  return s;
}

}  // namespace ddp
