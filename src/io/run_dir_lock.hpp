#pragma once
// One run at a time in a run directory. Two runs in one (the same job submitted
// twice, the tasks of a job array given one input file) would write over each
// other's checkpoints, `latest` and metrics.jsonl, and each would resume from the
// other's checkpoints: nothing would fail, and the results would be wrong.
//
// Rank 0 holds a write lock (fcntl, an open file description's lock) on
// <run_dir>/ddp_train.lock from start-up until the process ends, and writes who holds
// it into the file. The kernel (and a network file system's lock manager) drops the
// lock when the process ends, however it ends: a run killed or crashed leaves no
// stale lock, and a requeued job starts in its directory as before.

#include <string>

namespace ddp {

class RunDirLock {
 public:
  RunDirLock() = default;  // holds nothing
  // Takes the lock on <run_dir>/ddp_train.lock (run_dir exists); `input` (the input
  // file's path) goes into the file with the pid, host, Slurm job and time. problem():
  // why this run must not go on (another run holds it; the file cannot be opened), or
  // "". warning(): where the file system keeps no locks, so none is held, or "".
  RunDirLock(const std::string& run_dir, const std::string& input);
  ~RunDirLock();
  RunDirLock(RunDirLock&& other) noexcept;
  RunDirLock& operator=(RunDirLock&& other) noexcept;
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

  bool held() const { return fd_ >= 0; }
  const std::string& problem() const { return problem_; }
  const std::string& warning() const { return warning_; }

  static std::string file_of(const std::string& run_dir);  // <run_dir>/ddp_train.lock
  // Who holds the lock of run_dir now, as its file says ("pid ... on ..."), without
  // taking it; "" when no one does (or the file system keeps no locks).
  static std::string holder(const std::string& run_dir);

 private:
  int fd_ = -1;
  std::string problem_, warning_;
};

}  // namespace ddp
