// Putting a checkpoint on disk (io/checkpoint.hpp), rank 0: the file made in memory
// by HDF5 (the core driver) and written with write(2), so that its size is known
// before the disk is touched, a failure is errno's own (ENOSPC, EDQUOT, EIO), and
// HDF5 never holds a half-written file; temp file, fsync, rename, fsync of the
// directory, then `latest` the same way (and best.h5, a symbolic link); room made on a
// full disk; the newest K kept, and the best.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "comm/log.hpp"
#include "comm/watchdog.hpp"
#include "io/checkpoint_format.hpp"
#include "io/metrics.hpp"

namespace ddp {

namespace ckpt {

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) names.push_back(e->d_name);
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool is_checkpoint_name(const std::string& n) {
  return n.size() == checkpoint_name(0).size() && n.rfind("ckpt_", 0) == 0 &&
         n.compare(n.size() - 3, 3, ".h5") == 0;
}

namespace {

// Why a step of putting the file on disk failed: "fsync: Input/output error".
struct WriteFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void throw_errno(const std::string& what) {
  throw WriteFailure(what.empty() ? std::strerror(errno) : what + ": " + std::strerror(errno));
}

// Puts a file on disk in runs of kRunBytes while it is written, each run one progress
// for the ranks waiting for this checkpoint. One fsync at the end would write the
// whole file from the page cache in one call that says nothing while it lasts: on a
// file system slow to write (a busy Lustre, NFS, a throttled disk) a checkpoint of
// a few hundred MB then outlasts comm.timeout_s, and the waiting ranks' watchdog
// ends a healthy job naming rank 0 (tests/checkpoint/slow_disk.py). The writeback of
// each run starts once it is written (sync_file_range), and the run before it is
// waited for then, so the disk always has a run to write; the fsync at the end has
// the metadata left. Where the file system does not take sync_file_range, the fsync
// does it all, as before.
class Writeback {
 public:
  static constexpr off_t kRunBytes = off_t(4) << 20;

  explicit Writeback(int fd) : fd_(fd) {}

  // `end` bytes of the file are written: starts the runs done since the last call and
  // waits for the ones before them.
  void written(off_t end) {
    while (usable_ && end - started_ >= kRunBytes) {
      sync(started_, kRunBytes, SYNC_FILE_RANGE_WRITE);
      started_ += kRunBytes;
      wait_before(started_ - kRunBytes);
    }
  }
  // The rest of the file's `size` bytes on disk, a run at a time, before its fsync.
  void finish(off_t size) {
    while (usable_ && waited_ < size) wait_before(std::min(size, waited_ + kRunBytes));
  }

 private:
  void wait_before(off_t end) {
    if (end <= waited_) return;
    sync(waited_, end - waited_,
         SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    waited_ = end;
    watchdog::progress();
  }
  void sync(off_t offset, off_t n, unsigned flags) {
    if (!usable_ || sync_file_range(fd_, offset, n, flags) == 0) return;
    // Not taken here (a pipe-like file, an old kernel): the fsync does the writing.
    if (errno == EINVAL || errno == ESPIPE || errno == ENOSYS || errno == EOPNOTSUPP) {
      usable_ = false;
      return;
    }
    // A write error is reported once per open file (errseq): the fsync would not see it again.
    throw_errno("sync_file_range");
  }

  int fd_;
  bool usable_ = true;
  off_t started_ = 0;  // bytes whose writeback has been started
  off_t waited_ = 0;   // bytes on disk
};

// Writes `pieces` one after the other to a new file `path` and puts it on disk
// (Writeback), then fsyncs it; kRunBytes a write(2) at most, each one progress.
void write_file(const std::string& path, const std::vector<FileImage::Piece>& pieces) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno("");
  off_t size = 0;
  try {
    Writeback writeback(fd);
    for (const auto& [data, n] : pieces)
      for (std::size_t done = 0; done < n;) {
        const off_t room = Writeback::kRunBytes - size % Writeback::kRunBytes;  // to the end of this run
        const ssize_t w = write(fd, data + done, std::min(n - done, std::size_t(room)));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) throw_errno("");
        done += std::size_t(w);
        size += off_t(w);
        watchdog::progress();
        writeback.written(size);
      }
    writeback.finish(size);
    // A file system that allocates late (NFS, XFS) reports a full disk in the writeback,
    // here or at close.
    if (fsync(fd) != 0) throw_errno("fsync");
  } catch (const WriteFailure&) {
    close(fd);
    throw;
  }
  if (close(fd) != 0) throw_errno("close");
}

void fsync_dir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw_errno("open of the directory for fsync");
  const int rc = fsync(fd);
  const int e = errno;
  close(fd);
  errno = e;
  if (rc != 0) throw_errno("fsync of the directory");
}

void rename_durably(const std::string& from, const std::string& to, const std::string& dir) {
  if (std::rename(from.c_str(), to.c_str()) != 0) throw_errno("rename to " + to);
  fsync_dir(dir);
}

// Temp files our writers make: ckpt_<step>.h5.tmp.<pid>, latest.tmp.<pid>, best.h5.tmp.<pid>.
bool is_our_temp_name(const std::string& n) {
  return (n.rfind("ckpt_", 0) == 0 || n.rfind("latest.tmp.", 0) == 0 ||
          n.rfind(std::string(kBestLink) + ".tmp.", 0) == 0) &&
         n.find(".tmp.") != std::string::npos;
}

// The checkpoint best.h5 names in `dir` ("" when there is no such link).
std::string best_target(const std::string& dir) {
  char buf[256];
  const ssize_t n = readlink((dir + "/" + kBestLink).c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, std::size_t(n)) : std::string();
}

// Bytes the file system of `dir` has free for us; -1 when it does not say.
long long free_bytes(const std::string& dir) {
  struct statvfs st {};
  if (statvfs(dir.c_str(), &st) != 0) return -1;
  return (long long)st.f_bavail * (long long)st.f_frsize;
}
long long block_size(const std::string& dir) {
  struct statvfs st {};
  return statvfs(dir.c_str(), &st) == 0 && st.f_frsize > 0 ? (long long)st.f_frsize : 4096;
}

std::string human_bytes(long long n) {
  char buf[32];
  if (n < 0) return "unknown";
  if (n < 1024) return std::to_string(n) + " B";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = double(n) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

// Frees `need` bytes in the checkpoint directory if it has less: removes its oldest
// checkpoints, never the newest valid one (resume 'auto' would take it) nor the one
// best.h5 names (io.keep_best), and warns.
// Removes nothing when no checkpoint is valid: then nothing tells what is safe to lose.
void make_room(const std::string& run_dir, long long need, const std::string& writing) {
  const std::string dir = checkpoint_dir(run_dir);
  const long long before = free_bytes(dir);
  if (before < 0 || before >= need) return;
  std::string keep;
  for (const std::string& path : checkpoint_candidates(run_dir)) {
    try {
      read_verified(path, /*weights_only=*/false);
      keep = path.substr(dir.size() + 1);
      break;
    } catch (const CheckpointError&) {
    }
  }
  if (keep.empty()) return;
  const std::string best = best_target(dir);
  std::string removed;
  for (const std::string& n : list_dir(dir)) {  // oldest first
    if (free_bytes(dir) >= need) break;
    if (is_checkpoint_name(n) && n != keep && n != best && std::remove((dir + "/" + n).c_str()) == 0)
      removed += (removed.empty() ? "" : ", ") + n;
  }
  if (!removed.empty())
    log::warn("checkpoint: " + dir + " has " + human_bytes(before) + " free and " + writing + " needs " +
              human_bytes(need) + ": removed the older " + removed + " (" + keep +
              ", the newest valid checkpoint, stays" +
              (best.empty() || best == keep ? "" : "; so does " + best + ", the best (" + kBestLink + ")") +
              ")");
}

// The checkpoint directory made, and what an earlier attempt left in it (a writer
// killed, or refused by a full disk) removed: it may hold the very space this one needs.
void prepare_dir(const std::string& dir, const std::string& path) {
  const std::string problem = make_directories(dir);
  if (!problem.empty()) throw CheckpointWriteError("cannot write checkpoint " + path + ": " + problem);
  for (const std::string& n : list_dir(dir))
    if (is_our_temp_name(n)) std::remove((dir + "/" + n).c_str());
}

// `image` as dir/name through a temp file, then `latest` naming it. A failure leaves
// the directory as it was (no temp file to fill the disk for the next attempt, no
// checkpoint that `latest` does not name) and throws CheckpointWriteError.
void put_on_disk(const std::string& dir, const std::string& name, const FileImage& image) {
  const std::string path = dir + "/" + name;
  std::string previous;  // what `latest` names now: it stays so if this write fails
  {
    std::ifstream in(dir + "/latest");
    in >> previous;
  }
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  const std::string latest_tmp = dir + "/latest.tmp." + std::to_string(getpid());
  bool renamed = false;
  try {
    write_file(tmp, image.pieces());
    if (const char* delay = std::getenv("DDP_TEST_CHECKPOINT_DELAY_MS"))  // test hook, see the header
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atol(delay)));
    rename_durably(tmp, path, dir);
    renamed = true;
    // The pointer, the same way: a reader sees the old name or the new one, never a torn one.
    const std::string line = name + "\n";
    write_file(latest_tmp, {{line.data(), line.size()}});
    rename_durably(latest_tmp, dir + "/latest", dir);
  } catch (const WriteFailure& e) {
    std::remove(tmp.c_str());
    std::remove(latest_tmp.c_str());
    if (renamed && name != previous) std::remove(path.c_str());
    throw CheckpointWriteError("cannot write checkpoint " + path + ": " + e.what() + " (" + dir + " has " +
                               human_bytes(free_bytes(dir)) + " free, the checkpoint needs " +
                               human_bytes((long long)image.size()) + "); " +
                               (previous.empty() ? "no earlier checkpoint" : previous + " stays the latest"));
  }
}

// best.h5 made to name `name` (a checkpoint of `dir`): a link made beside it, then
// renamed over it, so that a reader finds the old checkpoint or the new one. A failure
// is CheckpointWriteError (the checkpoint itself is on disk, and `latest`).
void point_best(const std::string& dir, const std::string& name) {
  const std::string link = dir + "/" + kBestLink, tmp = link + ".tmp." + std::to_string(getpid());
  try {
    if (symlink(name.c_str(), tmp.c_str()) != 0) throw_errno("symlink " + tmp);
    rename_durably(tmp, link, dir);
  } catch (const WriteFailure& e) {
    std::remove(tmp.c_str());
    throw CheckpointWriteError("cannot make " + link + " name " + name + " (io.keep_best): " + e.what());
  }
}

// Keeps the newest `keep` checkpoints of `dir`, `name` whatever its age, and the one
// best.h5 names.
void keep_newest(const std::string& dir, int keep, const std::string& name) {
  const std::string best = best_target(dir);
  std::vector<std::string> ckpts;
  for (const std::string& n : list_dir(dir))
    if (is_checkpoint_name(n)) ckpts.push_back(n);
  for (std::size_t i = 0; i + std::size_t(keep) < ckpts.size(); ++i)
    if (ckpts[i] != name && ckpts[i] != best) std::remove((dir + "/" + ckpts[i]).c_str());
}

}  // namespace
}  // namespace ckpt

std::string checkpoint_dir(const std::string& run_dir) { return run_dir + "/checkpoints"; }

std::string best_link(const std::string& run_dir) { return checkpoint_dir(run_dir) + "/" + kBestLink; }

std::string checkpoint_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ckpt_%09lld.h5", (long long)step);
  return buf;
}

namespace {
const char* const kBestMetrics[] = {"none", "val_loss", "val_acc", "val_acc5"};
constexpr std::int64_t kBestMetricCount = std::int64_t(sizeof kBestMetrics / sizeof kBestMetrics[0]);
}  // namespace

const char* best_metric_name(std::int64_t metric) {
  return metric >= 0 && metric < kBestMetricCount ? kBestMetrics[metric] : "";
}

std::vector<std::string> best_metric_names() { return {std::begin(kBestMetrics), std::end(kBestMetrics)}; }

std::int64_t best_metric_index(const std::string& name) {
  for (std::int64_t m = 0; m < kBestMetricCount; ++m)
    if (name == kBestMetrics[m]) return m;
  return -1;
}

PendingCheckpoint::PendingCheckpoint(const std::string& run_dir, int keep, const Model& model,
                                     OptimizerSnapshot optimizer, const TrainingState& state,
                                     const RunInput& input, const DataFingerprint* data)
    : run_dir_(run_dir),
      name_(checkpoint_name(state.step)),
      keep_(keep),
      best_(state.best_metric != 0 && state.best_step == state.step) {
  using namespace ckpt;
  const std::string dir = checkpoint_dir(run_dir_);
  prepare_dir(dir, path());
  image_ = std::make_unique<FileImage>(path(), model, std::move(optimizer), state, input, data);
  const long long block = block_size(dir);
  // The file in whole blocks, and a block for `latest`.
  const long long need = ((long long)image_->size() + block - 1) / block * block + block;
  make_room(run_dir_, need, name_);
}

PendingCheckpoint::~PendingCheckpoint() = default;

std::string PendingCheckpoint::path() const { return checkpoint_dir(run_dir_) + "/" + name_; }

std::size_t PendingCheckpoint::size() const { return image_->size(); }

bool holds_checkpoint(const std::string& run_dir, std::int64_t step) {
  return access((checkpoint_dir(run_dir) + "/" + checkpoint_name(step)).c_str(), F_OK) == 0;
}

std::string best_link_problem(const std::string& run_dir) {
  const std::string link = best_link(run_dir);
  struct stat st {};
  if (lstat(link.c_str(), &st) != 0 || S_ISLNK(st.st_mode)) return "";
  return "io.keep_best: " + link + " is " + (S_ISDIR(st.st_mode) ? "a directory" : "a file") +
         ", not the link to the best checkpoint that ddp_train keeps at that name: move or rename it";
}

bool restore_best_link(const std::string& run_dir, std::int64_t best_step) {
  const std::string dir = checkpoint_dir(run_dir), name = checkpoint_name(best_step);
  if (!holds_checkpoint(run_dir, best_step)) return false;
  const std::string before = ckpt::best_target(dir);
  if (before == name) return true;
  try {
    ckpt::point_best(dir, name);
    log::info(
        "checkpoint: " + best_link(run_dir) + " names " + name + ", the best of the checkpoint resumed from" +
        (before.empty() ? "" : " (it named " + before + ", of a continuation this resume leaves behind)"));
  } catch (const CheckpointWriteError& e) {
    log::warn(std::string(e.what()) + "; the run goes on");
  }
  return true;
}

void PendingCheckpoint::write() {
  const std::string dir = checkpoint_dir(run_dir_);
  ckpt::put_on_disk(dir, name_, *image_);
  if (best_) ckpt::point_best(dir, name_);
  ckpt::keep_newest(dir, keep_, name_);
}

std::string save_checkpoint(const std::string& run_dir, int keep, const Model& model,
                            OptimizerSnapshot optimizer, const TrainingState& state, const RunInput& input,
                            const DataFingerprint* data) {
  PendingCheckpoint checkpoint(run_dir, keep, model, std::move(optimizer), state, input, data);
  checkpoint.write();
  return checkpoint.path();
}

}  // namespace ddp
