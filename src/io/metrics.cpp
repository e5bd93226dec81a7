#include "io/metrics.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "comm/check.hpp"
#include "comm/json.hpp"
#include "comm/log.hpp"

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

namespace {

// The optimizer step of a record as MetricsWriter writes it ({"epoch": 3, "step": 15,
// ...}); -1 where the line has none.
long long step_of(const std::string& line) {
  const std::string key = "\"step\": ";
  const std::size_t at = line.find(key);
  if (at == std::string::npos) return -1;
  char* end = nullptr;
  const long long step = std::strtoll(line.c_str() + at + key.size(), &end, 10);
  return end == line.c_str() + at + key.size() ? -1 : step;
}

// Moves the records of `path` after `start_step` (and a last line cut short) to
// `aside`, appended; the rest stays, rewritten through a temp file. Says so in one line.
void set_aside_records_after(const std::string& path, const std::string& aside, std::int64_t start_step) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string kept, moved;
  std::size_t records = 0;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t nl = text.find('\n', at);
    const std::string line = text.substr(at, nl == std::string::npos ? std::string::npos : nl + 1 - at);
    at = nl == std::string::npos ? text.size() : nl + 1;
    if (nl != std::string::npos && step_of(line) <= start_step) {
      kept += line;
    } else {
      moved += nl == std::string::npos ? line + "\n" : line;
      ++records;
    }
  }
  if (records == 0) return;
  const auto write = [](const std::string& file, const char* mode, const std::string& bytes) {
    std::FILE* f = std::fopen(file.c_str(), mode);
    const bool ok = f && std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() &&
                    std::fflush(f) == 0 && fsync(fileno(f)) == 0;
    const int e = errno;
    if (f) std::fclose(f);
    if (!ok) DDP_FATAL("cannot write " << file << ": " << std::strerror(e));
  };
  write(aside, "a", moved);  // first: a kill in between leaves a record twice, never none
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  write(tmp, "w", kept);
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    DDP_FATAL("cannot rename " << tmp << " to " << path << ": " << std::strerror(errno));
  log::info("metrics: " + std::to_string(records) + (records == 1 ? " record" : " records") + " of " + path +
            " after step " + std::to_string(start_step) + ", where this run starts, moved to " + aside +
            ": a run before this one trained those steps, and this one trains them again");
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& run_dir, bool enabled, std::int64_t start_step)
    : path_(run_dir + "/metrics.jsonl") {
  if (!enabled) return;
  set_aside_records_after(path_, run_dir + "/metrics_replaced.jsonl", start_step);
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
