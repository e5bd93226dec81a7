#pragma once
// The check family: every MPI, HDF5 and library call goes through one of these.
// A failure prints `rank N (host): file:line: message` and calls MPI_Abort, so no
// rank is left waiting in a collective. Nothing here is compiled out.
//
// Two kinds of failure, two endings:
// - what one rank sees alone (a failed call, an exception nobody catches, on any
//   thread): that rank prints one line `rank N (host): what failed: message` and
//   calls MPI_Abort, which takes the other ranks down wherever they wait;
// - what every rank finds together (the input file, the data checks, --check):
//   one line `error: message` from one rank, then every rank leaves through
//   MPI_Finalize with exit status 1, without the launcher's abort banner.

#include <mpi.h>

#include <sstream>
#include <stdexcept>
#include <string>

namespace ddp {

// An error in what the user gave us (input file, data files, command line).
// Thrown by code that has no MPI context (parser, config, sampler, shard checks);
// the driver turns it into a collective fatal error.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Print `rank N (host): file:line: msg` on stderr and MPI_Abort. Any rank, any thread.
[[noreturn]] void fatal(const char* file, int line, const std::string& msg);
// The same with `what` in place of file:line: `rank N (host): what: msg`.
[[noreturn]] void fatal_as(const std::string& what, const std::string& msg);

// Make std::terminate, which an exception that no handler catches ends in (on any
// thread), print `rank N (host): uncaught <type>: <what()>` and MPI_Abort, instead
// of libstdc++'s `terminate called after ...` and a SIGABRT stack dump. Called
// first thing by Context.
void install_terminate_handler();

// Makes the communicator on which a collective error's exit checks that every rank is
// there (fatal_all, fatal_if_any): a duplicate of MPI_COMM_WORLD that no other call
// uses, so that no other rank's nonblocking collective (mpi_wait.hpp) can match that
// check's MPI_Ibarrier. Collective; called by Context after MPI_Init. Without it
// (unit tests), the check runs on the error's own communicator.
void make_exit_communicator();

// For errors every rank of `comm` (all of MPI_COMM_WORLD) detects identically (a
// bad input file, a missing shard): rank 0 prints the one line `error: msg`, then
// every rank calls MPI_Finalize and exits with status 1, so the user sees the
// message once and no abort banner. Collective. `say` false: rank 0 prints nothing
// either (where another job prints the same line: Context's separate jobs).
[[noreturn]] void fatal_all(MPI_Comm comm, const std::string& msg, bool say = true);

// While one lives on a thread, a failure there (a check, an uncaught exception)
// adds that the training step was being captured as a CUDA graph, and that
// train.cuda_graph = 'off' runs without: a call that cannot be captured is named so.
struct CaptureScope {
  CaptureScope();
  ~CaptureScope();
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;
};

// What a fatal error (fatal, fatal_as, an uncaught exception; any thread) runs after
// its line is out and before MPI_Abort: a NCCL communicator's ncclCommAbort, so that
// its kernels and proxy threads stop and the peers see an error, not a silence. Each
// hook runs once, all of them within kAbortHooksS (the job ends either way);
// remove_abort_hook waits for a hook that is running.
constexpr double kAbortHooksS = 5.0;
using AbortHook = void (*)(void* arg);
void add_abort_hook(AbortHook hook, void* arg);
void remove_abort_hook(AbortHook hook, void* arg);

// Text of an MPI error code.
std::string mpi_error_string(int code);
// Text of the innermost HDF5 error on the default stack.
std::string h5_error_string();

}  // namespace ddp

#define DDP_FATAL(msg)                                     \
  do {                                                     \
    std::ostringstream ddp_fatal_os_;                      \
    ddp_fatal_os_ << msg;                                  \
    ::ddp::fatal(__FILE__, __LINE__, ddp_fatal_os_.str()); \
  } while (0)

#define DDP_REQUIRE(cond, msg)                                  \
  do {                                                          \
    if (!(cond)) DDP_FATAL("check failed: " #cond ": " << msg); \
  } while (0)

#define MPI_CHECK(call)                                                                                      \
  do {                                                                                                       \
    int ddp_mpi_rc_ = (call);                                                                                \
    if (ddp_mpi_rc_ != MPI_SUCCESS) DDP_FATAL(#call << " failed: " << ::ddp::mpi_error_string(ddp_mpi_rc_)); \
  } while (0)

// HDF5 calls return a negative value (herr_t or hid_t) on failure.
#define H5_CHECK(call)                                                               \
  ([&]() {                                                                           \
    auto ddp_h5_rc_ = (call);                                                        \
    if (ddp_h5_rc_ < 0) DDP_FATAL(#call << " failed: " << ::ddp::h5_error_string()); \
    return ddp_h5_rc_;                                                               \
  }())

namespace ddp {
// For a condition that may fail on some ranks only (a directory rank 0 could not
// create, a file one rank could not read): all ranks agree; if any failed, the
// lowest failing rank prints its `msg` and every rank exits as in fatal_all.
// Collective.
void fatal_if_any(MPI_Comm comm, bool failed, const std::string& msg);

// The lowest rank's non-empty `mine`, on every rank; "" where every rank's is empty.
// Collective.
std::string first_words(MPI_Comm comm, const std::string& mine);

// Run `body`; an InputError thrown by it is a collective error (every rank throws
// the same one): rank 0 reports it and every rank exits as in fatal_all.
template <class F>
auto collective_input(MPI_Comm comm, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const InputError& e) {
    fatal_all(comm, e.what());
  }
}
}  // namespace ddp
