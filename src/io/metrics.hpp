#pragma once
// Rank 0 appends one JSON object per line to <run_dir>/metrics.jsonl.

#include <cstdint>
#include <cstdio>
#include <string>
#include <variant>
#include <vector>

namespace ddp {

using MetricValue = std::variant<long long, double, std::string>;
using MetricRecord = std::vector<std::pair<std::string, MetricValue>>;  // keys in order

// One JSON object on one line; non-finite doubles become null (JSON has no NaN).
std::string to_json_line(const MetricRecord& record);

class MetricsWriter {
 public:
  // Opens (appends to) <run_dir>/metrics.jsonl; `run_dir` must exist. Only the
  // rank that passes enabled=true writes. `start_step`: the optimizer step this run
  // starts from (its checkpoint's; 0 for a new run). Records of later steps are of
  // training this run does again (a run killed after an epoch's record and before
  // its checkpoint, checkpoints every few epochs, a new run in an old directory):
  // they move to <run_dir>/metrics_replaced.jsonl with one line saying so, and so
  // does a last line cut short by a kill, so that metrics.jsonl holds each epoch once.
  MetricsWriter(const std::string& run_dir, bool enabled, std::int64_t start_step = 0);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write(const MetricRecord& record);  // flushed at once: a killed job keeps its lines
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// mkdir -p; returns an empty string on success, else the reason.
std::string make_directories(const std::string& path);

}  // namespace ddp
