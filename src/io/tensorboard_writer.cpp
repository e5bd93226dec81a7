#include "io/tensorboard_writer.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "comm/log.hpp"
#include "io/metrics.hpp"
#include "io/tfrecord.hpp"
#if DDP_WITH_TENSORBOARD
#include "io/tensorboard/events.hpp"
#endif

namespace ddp {

namespace {
double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& run_dir, bool enabled, std::int64_t start_step) {
  if (!enabled || !kTensorBoardBuilt) return;
  const std::string dir = run_dir + "/tb";
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const double t = wall_time();
  path_ = dir + "/events.out.tfevents." + std::to_string(std::int64_t(t)) + "." + host;
  const std::string problem = make_directories(dir);
  if (!problem.empty()) {
    fail(problem);
    return;
  }
  // Appends: a second run started in the same second on this host adds its records.
  file_ = std::fopen(path_.c_str(), "ab");
  if (!file_) {
    fail(std::string("cannot open it: ") + std::strerror(errno));
    return;
  }
#if DDP_WITH_TENSORBOARD
  pending_ = tfrecord(tb::version_event(t)) + tfrecord(tb::session_start_event(t, start_step + 1));
#else
  (void)start_step;
#endif
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  flush();
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::scalar(const std::string& tag, std::int64_t step, double value) {
  if (!file_) return;
#if DDP_WITH_TENSORBOARD
  pending_ += tfrecord(tb::scalar_event(wall_time(), step, tag, float(value)));
#else
  (void)tag, (void)step, (void)value;
#endif
}

void TensorBoardWriter::flush() {
  if (!file_ || pending_.empty()) return;
  errno = 0;
  if (std::fwrite(pending_.data(), 1, pending_.size(), file_) != pending_.size() || std::fflush(file_) != 0) {
    fail(std::string("cannot write it: ") + std::strerror(errno));
    return;
  }
  pending_.clear();
}

void TensorBoardWriter::fail(const std::string& what) {
  log::warn("io.tensorboard: " + path_ + ": " + what +
            "; no more TensorBoard events are written, training goes on");
  if (file_) std::fclose(file_);
  file_ = nullptr;
  pending_.clear();
}

}  // namespace ddp
