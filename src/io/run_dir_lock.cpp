#include "io/run_dir_lock.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>
#include <utility>

#include "comm/fault_injection.hpp"
#include "comm/utc_text.hpp"

namespace ddp {

namespace {

// Who holds the lock, as its file says it: "pid 4242 on node12, Slurm job 17, since
// 2026-11-29 01:23:45 UTC, input inputs/resnet50.nml".
std::string holder_text(const std::string& input) {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  std::string s = "pid " + std::to_string(getpid()) + " on " + host;
  const char* array = std::getenv("SLURM_ARRAY_JOB_ID");
  const char* task = std::getenv("SLURM_ARRAY_TASK_ID");
  const char* job = std::getenv("SLURM_JOB_ID");
  if (array && task && *array && *task)
    s += std::string(", Slurm job ") + array + "_" + task;
  else if (job && *job)
    s += std::string(", Slurm job ") + job;
  return s + ", since " + utc_text(std::time(nullptr)) + ", input " + input;
}

// The first line of the lock file: what its holder wrote. A holder writes it just
// after it takes the lock, so a run that finds the lock taken and the file empty
// (two tasks of a job array that start together) looks again for up to 2 s.
std::string read_holder(int fd) {
  for (int look = 0; look < 40; ++look) {
    char buf[1024];
    const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    const std::string s = n > 0 ? std::string(buf, std::size_t(n)) : "";
    if (s.find('\n') != std::string::npos && s[0] != '\n') return s.substr(0, s.find('\n'));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "it has not written who it is yet";
}

// fcntl's `ofd` command on a write lock of the whole file (F_OFD_SETLK: take it, not
// waiting; F_OFD_GETLK: whether another holds it, in fl), else `process` where the
// kernel has no open file description locks (EINVAL, before Linux 3.15). An open
// file description's lock belongs to this descriptor, so no other open and close of
// the file in this process drops it, as close drops a process's F_SETLK locks.
int whole_file(int fd, int ofd, int process, struct flock* fl) {
  *fl = {};
  fl->l_type = F_WRLCK;
  fl->l_whence = SEEK_SET;
  if (fcntl(fd, ofd, fl) == 0) return 0;
  if (errno != EINVAL) return -1;
  *fl = {};
  fl->l_type = F_WRLCK;
  fl->l_whence = SEEK_SET;
  return fcntl(fd, process, fl);
}

}  // namespace

std::string RunDirLock::file_of(const std::string& run_dir) { return run_dir + "/ddp_train.lock"; }

RunDirLock::RunDirLock(const std::string& run_dir, const std::string& input) {
  const std::string path = file_of(run_dir);
  fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    problem_ = "io.run_dir: cannot open " + path +
               " (the lock that keeps a second run out): " + std::strerror(errno);
    return;
  }
  int rc = -1;
  struct flock fl {};
  if (inject_fault(FaultSite::run_dir_lock, 0))  // tests: a file system that keeps no locks
    errno = ENOLCK;
  else
    rc = whole_file(fd_, F_OFD_SETLK, F_SETLK, &fl);
  if (rc == 0) {
    const std::string line = holder_text(input) + "\n";
    // Who holds it, for the run that finds it held; the lock does not depend on it.
    if (ftruncate(fd_, 0) == 0 && pwrite(fd_, line.data(), line.size(), 0) == ssize_t(line.size()))
      fsync(fd_);
    return;
  }
  const int e = errno;
  const std::string holder = read_holder(fd_);
  close(fd_);
  fd_ = -1;
  if (e == EAGAIN || e == EACCES) {
    problem_ = "io.run_dir '" + run_dir + "' is in use by another run of ddp_train (" + holder +
               "; it holds the lock on " + path +
               "): two runs in one directory would write over each other's checkpoints and metrics; give "
               "this run an io.run_dir of its own, or start it when that run has ended";
    return;
  }
  warning_ = "io.run_dir: the file system of '" + run_dir + "' keeps no file locks (fcntl on " + path + ": " +
             std::strerror(e) +
             "): nothing stops a second run from starting in this directory while this one runs";
}

std::string RunDirLock::holder(const std::string& run_dir) {
  const int fd = open(file_of(run_dir).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  struct flock fl {};
  const bool held = whole_file(fd, F_OFD_GETLK, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
  const std::string who = held ? read_holder(fd) : "";
  close(fd);
  return who;
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) close(fd_);
}

RunDirLock::RunDirLock(RunDirLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      problem_(std::move(other.problem_)),
      warning_(std::move(other.warning_)) {}

RunDirLock& RunDirLock::operator=(RunDirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    problem_ = std::move(other.problem_);
    warning_ = std::move(other.warning_);
  }
  return *this;
}

}  // namespace ddp
