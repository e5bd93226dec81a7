#include "io/metrics.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "comm/check.hpp"
#include "comm/json.hpp"

namespace ddp {

namespace {
std::string json_value(const MetricValue& v) {
  if (auto* i = std::get_if<long long>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) {
    if (!std::isfinite(*d)) return "null";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", *d);  // round-trips exactly
    return buf;
  }
  return json_string(std::get<std::string>(v));
}
}  // namespace

std::string to_json_line(const MetricRecord& record) {
  std::string line = "{";
  for (std::size_t i = 0; i < record.size(); ++i) {
    if (i) line += ", ";
    line += json_string(record[i].first) + ": " + json_value(record[i].second);
  }
  return line + "}";
}

MetricsWriter::MetricsWriter(const std::string& run_dir, bool enabled) : path_(run_dir + "/metrics.jsonl") {
  if (!enabled) return;
  file_ = std::fopen(path_.c_str(), "a");
  if (!file_) DDP_FATAL("cannot open " << path_ << " for appending: " << std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const MetricRecord& record) {
  if (!file_) return;
  const std::string line = to_json_line(record) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    DDP_FATAL("cannot write " << path_ << ": " << std::strerror(errno));
}

std::string make_directories(const std::string& path) {
  std::string partial;
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty()) continue;
    if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST)
      return "cannot create directory '" + partial + "': " + std::strerror(errno);
  }
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return "'" + path + "' is not a directory";
  return "";
}

}  // namespace ddp
