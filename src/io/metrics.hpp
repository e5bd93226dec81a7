#pragma once
// Rank 0 appends one JSON object per line to <run_dir>/metrics.jsonl.

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
  // rank that passes enabled=true writes.
  MetricsWriter(const std::string& run_dir, bool enabled);
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
