#include "comm/fault_injection.hpp"

#include <unistd.h>

#include <Kokkos_Core.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#if DDP_WITH_ONEDNN
#include <dnnl.hpp>
#endif
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/check.hpp"
#include "comm/log.hpp"
#include "comm/watchdog.hpp"

namespace ddp {

namespace {

// The digits of s from *at on, at least one and at most `most`: their value, *at moved
// past them; -1 (*at unmoved) where there are none or more. (These variables' forms
// are read by hand: std::regex pulls in code that GCC's sanitizer build warns about.)
long long read_digits(const std::string& s, std::size_t* at, std::size_t most) {
  std::size_t end = *at;
  while (end < s.size() && s[end] >= '0' && s[end] <= '9') ++end;
  if (end == *at || end - *at > most) return -1;
  const long long v = std::stoll(s.substr(*at, end - *at));
  *at = end;
  return v;
}

// Whether s holds `word` at *at; *at moved past it where it does.
bool read_word(const std::string& s, std::size_t* at, const char* word) {
  const std::size_t n = std::strlen(word);
  if (s.compare(*at, n, word) != 0) return false;
  *at += n;
  return true;
}

enum class Kind {
  none,
  exception,
  dnnl,
  bad_alloc,
  view_alloc,
  loader_exception,
  perturb,
  nan_gradient,
  stall_shards,
  stall_checkpoint,
  stall_open,
  stall_close,
  slow_shards,
  no_locks,
  kill_shared_memory,
  stall_end
};

struct Plan {
  Kind kind = Kind::none;
  int rank = -1;
  std::int64_t step = 0;
  std::string spec;        // the variable's text, named in the injected messages
  bool malformed = false;  // spec is not <kind>@rank<r>[:step<s>] (check_test_variables)
};

Plan read_plan() {
  Plan p;
  const char* env = std::getenv("DDP_INJECT_FAULT");
  if (!env || !*env) return p;
  p.spec = env;
  static const std::vector<std::pair<std::string, Kind>> kinds = {
      {"exception", Kind::exception},
      {"dnnl", Kind::dnnl},
      {"bad_alloc", Kind::bad_alloc},
      {"view_alloc", Kind::view_alloc},
      {"loader_exception", Kind::loader_exception},
      {"perturb", Kind::perturb},
      {"nan_gradient", Kind::nan_gradient},
      {"stall_shards", Kind::stall_shards},
      {"stall_checkpoint", Kind::stall_checkpoint},
      {"stall_open", Kind::stall_open},
      {"stall_close", Kind::stall_close},
      {"stall_end", Kind::stall_end},
      {"slow_shards", Kind::slow_shards},
      {"no_locks", Kind::no_locks},
      {"kill_shared_memory", Kind::kill_shared_memory}};
  // <kind>@rank<r>[:step<s>]
  const std::string& s = p.spec;
  std::size_t at = s.find('@');
  const std::string name = s.substr(0, at);
  long long rank = -1, step = 0;
  if (at != std::string::npos && read_word(s, &at, "@rank") && (rank = read_digits(s, &at, 9)) >= 0 &&
      (at == s.size() || (read_word(s, &at, ":step") && (step = read_digits(s, &at, 18)) >= 0)) &&
      at == s.size()) {
    for (const auto& [kind_name, kind] : kinds)
      if (name == kind_name) p.kind = kind;
    p.rank = int(rank);
    p.step = step;
  }
  p.malformed = p.kind == Kind::none;
  return p;
}

const Plan& plan() {
  static const Plan p = read_plan();
  return p;
}

// What oneDNN throws when no implementation fits: ask for an f16 matmul, which the
// oneDNN CPU builds we use (2.6) have no kernel for. A oneDNN with one (a CPU with
// AVX512-FP16) throws nothing here, so then the same error is thrown by hand.
[[noreturn]] void fail_dnnl() {
#if DDP_WITH_ONEDNN
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  const dnnl::memory::desc a({4, 8}, dt::f16, tag::ab), b({8, 16}, dt::f16, tag::ab),
      c({4, 16}, dt::f16, tag::ab);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), engine);
  throw dnnl::error(dnnl_unimplemented, "could not create a primitive descriptor iterator");
#else
  throw std::runtime_error("injected fault: the GPU build has no oneDNN (DDP_INJECT_FAULT=dnnl)");
#endif
}

// Outlives the call, so the compiler may not drop the allocation as unused.
std::vector<float> g_sink;

// DDP_TEST_EXIT_DELAY_MS: (milliseconds, rank); (0, -1) when unset, (-1, -1) when
// malformed.
std::pair<long long, int> read_exit_delay() {
  const char* env = std::getenv("DDP_TEST_EXIT_DELAY_MS");
  if (!env || !*env) return {0, -1};
  // <ms>@rank<r>
  const std::string s = env;
  std::size_t at = 0;
  long long ms = -1, rank = -1;
  if ((ms = read_digits(s, &at, 18)) < 0 || !read_word(s, &at, "@rank") ||
      (rank = read_digits(s, &at, 9)) < 0 || at != s.size())
    return {-1, -1};
  return {ms, int(rank)};
}

const std::pair<long long, int>& exit_delay() {
  static const std::pair<long long, int> delay = read_exit_delay();
  return delay;
}

// DDP_TEST_STEP_DELAY_US: microseconds; 0 when unset, -1 when malformed.
long long read_step_delay() {
  const char* env = std::getenv("DDP_TEST_STEP_DELAY_US");
  if (!env || !*env) return 0;
  const std::string s = env;
  std::size_t at = 0;
  const long long us = read_digits(s, &at, 9);
  return at == s.size() ? us : -1;
}

long long step_delay_us() {
  static const long long us = read_step_delay();
  return us;
}

// DDP_TEST_ABORT_HOOK=block@rank<r>: the rank; -1 when unset, -2 when malformed.
int read_abort_hook_rank() {
  const char* env = std::getenv("DDP_TEST_ABORT_HOOK");
  if (!env || !*env) return -1;
  const std::string s = env;
  std::size_t at = 0;
  long long rank = -1;
  if (!read_word(s, &at, "block@rank") || (rank = read_digits(s, &at, 9)) < 0 || at != s.size()) return -2;
  return int(rank);
}

// An abort hook that never returns, as an ncclCommAbort whose peer is gone.
void blocking_abort_hook(void*) {
  std::fprintf(stderr, "DDP_TEST_ABORT_HOOK on rank %d: the abort hook blocks\n", log::rank());
  std::fflush(stderr);
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

}  // namespace

bool inject_fault(FaultSite site, std::int64_t step) {
  const Plan& plan = ddp::plan();
  if (plan.kind == Kind::none || plan.step != step || plan.rank != log::rank()) return false;
  const FaultSite home = plan.kind == Kind::loader_exception     ? FaultSite::prefetch
                         : plan.kind == Kind::perturb            ? FaultSite::parameters
                         : plan.kind == Kind::nan_gradient       ? FaultSite::loss_gradient
                         : plan.kind == Kind::stall_shards       ? FaultSite::shard_layout
                         : plan.kind == Kind::slow_shards        ? FaultSite::shard_layout
                         : plan.kind == Kind::stall_checkpoint   ? FaultSite::start_checkpoint
                         : plan.kind == Kind::stall_open         ? FaultSite::shard_open
                         : plan.kind == Kind::stall_close        ? FaultSite::shard_close
                         : plan.kind == Kind::no_locks           ? FaultSite::run_dir_lock
                         : plan.kind == Kind::kill_shared_memory ? FaultSite::node_shared
                         : plan.kind == Kind::stall_end          ? FaultSite::communicator_end
                                                                 : FaultSite::train_step;
  if (site != home) return false;
  if (plan.kind == Kind::perturb || plan.kind == Kind::nan_gradient || plan.kind == Kind::no_locks)
    return true;
  if (plan.kind == Kind::slow_shards) {  // not a failure: reading that moves on, slowly
    for (int piece = 0; piece < 5; ++piece) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      watchdog::progress();
    }
    return false;
  }
  const std::string what = "injected fault (DDP_INJECT_FAULT=" + plan.spec + ")";
  switch (plan.kind) {
    case Kind::exception:
      throw std::runtime_error(what);
    case Kind::dnnl:
      fail_dnnl();
    case Kind::bad_alloc:
      // 4 PiB: more than any x86-64 address space (128 TiB), so operator new fails
      // whatever the memory and overcommit settings.
      g_sink.resize(std::size_t(1) << 50);
      break;
    case Kind::view_alloc: {
      const Kokkos::View<float*> huge("DDP_INJECT_FAULT", std::size_t(1) << 50);  // 4 PiB, as above
      break;
    }
    case Kind::loader_exception:
      throw std::out_of_range(what + " reading batch " + std::to_string(step));
    case Kind::kill_shared_memory:
      std::fprintf(stderr, "rank %d (pid %ld): DDP_INJECT_FAULT: killed\n", log::rank(), long(getpid()));
      std::fflush(stderr);
      std::raise(SIGKILL);
      break;
    case Kind::stall_shards:
    case Kind::stall_checkpoint:
    case Kind::stall_open:
    case Kind::stall_close:
    case Kind::stall_end:
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // until the job is ended
    case Kind::perturb:
    case Kind::nan_gradient:
    case Kind::slow_shards:
    case Kind::no_locks:
    case Kind::none:
      break;
  }
  DDP_FATAL(what << ": the allocation succeeded");
}

void check_test_variables(MPI_Comm world) {
  if (plan().malformed)
    fatal_all(world,
              "DDP_INJECT_FAULT='" + plan().spec +
                  "': expected <kind>@rank<r>[:step<s>] with kind exception, dnnl, bad_alloc, view_alloc, "
                  "loader_exception, perturb, nan_gradient, stall_shards, stall_checkpoint, stall_open, "
                  "stall_close, stall_end, slow_shards, no_locks or kill_shared_memory");
  if (exit_delay().first < 0)
    fatal_all(world, "DDP_TEST_EXIT_DELAY_MS='" + std::string(std::getenv("DDP_TEST_EXIT_DELAY_MS")) +
                         "': expected <ms>@rank<r>");
  if (step_delay_us() < 0)
    fatal_all(world, "DDP_TEST_STEP_DELAY_US='" + std::string(std::getenv("DDP_TEST_STEP_DELAY_US")) +
                         "': expected a number of microseconds");
  const int hook_rank = read_abort_hook_rank();
  if (hook_rank == -2)
    fatal_all(world, "DDP_TEST_ABORT_HOOK='" + std::string(std::getenv("DDP_TEST_ABORT_HOOK")) +
                         "': expected block@rank<r>");
  if (hook_rank == log::rank()) add_abort_hook(blocking_abort_hook, nullptr);
}

void inject_exit_delay() {
  const auto& [ms, rank] = exit_delay();
  if (rank != log::rank() || ms <= 0) return;
  std::fprintf(stderr, "rank %d (pid %d): DDP_TEST_EXIT_DELAY_MS: %lld ms after MPI_Finalize\n", rank,
               int(getpid()), ms);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

void inject_abort_delay() {
  const auto& [ms, rank] = exit_delay();
  if (rank == log::rank() && ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

void inject_step_delay() {
  if (step_delay_us() > 0) std::this_thread::sleep_for(std::chrono::microseconds(step_delay_us()));
}

}  // namespace ddp
