#pragma once
// The timeline (io.trace): what this rank did, span by span, over a window of
// optimizer steps (io.trace_steps), written as a Chrome-trace JSON file that
// Perfetto (ui.perfetto.dev) and chrome://tracing open; tools/merge_traces puts the
// ranks' files into one, a process row per rank.
//
// Rows (Chrome-trace "threads") of a rank's process: 0 is the main thread (steps,
// data wait, forward and backward per layer, the wait for the gradient all-reduce,
// optimizer, checkpoint, validation); kBucketRow + b is bucket b's all-reduce, from
// the moment it starts to the moment this rank sees it complete. A bucket's row
// overlapping the main row's backward is the overlap DDP is for.
//
// Times are microseconds since a barrier of every rank at open(): the ranks' rows
// line up to within that barrier's exit skew. Spans cost one relaxed load outside
// the window; inside it each is two clock reads and a push under a mutex (the
// communication thread records too).

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp::trace {

constexpr int kMainRow = 0;
constexpr int kBucketRow = 100;  // + bucket number

// Collective over `comm`: the time origin (after a barrier), and the window of
// optimizer steps [first, last] (1-based, as the progress lines count them) whose
// spans go to `path`, this rank's file. `process` names the rank's row ("rank 1
// (node7)"); `meta` is a JSON object's members ("\"world_size\": 2, ...") kept in
// the file's otherData.
void open(MPI_Comm comm, const std::string& path, std::int64_t first, std::int64_t last,
          const std::string& process, const std::string& meta);
// Names a row of this rank's process (kMainRow, kBucketRow + b).
void name_row(int row, const std::string& name);

// The trainer starts optimizer step `step` (1-based): recording runs while it is in
// the window, and the file is written once a step past the window starts: returns
// its path then, else "".
std::string begin_step(std::int64_t step);
// Writes the file now if anything was recorded and it is not written yet (a run that
// ends, or stops for a requeue, inside the window). Returns its path, or "".
std::string close();

bool recording();       // inside the window: spans are kept
std::int64_t now_ns();  // nanoseconds since the origin

// A span of the row `row` from `begin_ns` to `end_ns`; args: a JSON object's members
// or "". Thread-safe.
void record(const std::string& name, const char* category, int row, std::int64_t begin_ns,
            std::int64_t end_ns, const std::string& args = "");

// Bucket `bucket`'s all-reduce of `bytes` on its row (kBucketRow + bucket): what every
// bucket reducer, MPI or NCCL, records.
void record_bucket(std::size_t bucket, std::int64_t bytes, std::int64_t begin_ns, std::int64_t end_ns);

// A span from construction to destruction on the main row, when recording.
class Span {
 public:
  Span(const std::string& name, const char* category, const std::string& args = "")
      : on_(recording()), category_(category), begin_(on_ ? now_ns() : 0) {
    if (on_) {
      name_ = name;
      args_ = args;
    }
  }
  ~Span() {
    if (on_) record(name_, category_, kMainRow, begin_, now_ns(), args_);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  bool on() const { return on_; }

 private:
  bool on_;
  const char* category_;
  std::int64_t begin_;
  std::string name_, args_;  // copied only when recording
};

}  // namespace ddp::trace
