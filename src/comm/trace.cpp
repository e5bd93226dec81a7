#include "comm/trace.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

#include "comm/check.hpp"
#include "comm/json.hpp"
#include "comm/log.hpp"
#include "comm/watchdog.hpp"

namespace ddp::trace {

namespace {

struct Event {
  std::string name;
  const char* category;
  int row;
  std::int64_t begin_ns, end_ns;
  std::string args;
};

struct Session {
  std::mutex mu;
  bool open = false, written = false;
  std::string path, process, meta;
  int rank = 0;
  std::int64_t first = 0, last = -1;
  std::chrono::steady_clock::time_point origin;
  std::map<int, std::string> rows;
  std::vector<Event> events;
};

Session& session() {
  static Session s;
  return s;
}

std::atomic<bool> g_recording{false};

// The file: metadata (process and row names, rows ordered), then the spans as
// complete events ("ph": "X"), times in microseconds with nanosecond digits.
bool write_file(Session& s) {
  std::FILE* f = std::fopen(s.path.c_str(), "w");
  if (!f) return false;
  const int pid = s.rank;
  std::fprintf(f, "{\"traceEvents\": [\n");
  std::fprintf(
      f, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": %s}},\n",
      pid, json_string(s.process).c_str());
  std::fprintf(f,
               "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, "
               "\"args\": {\"sort_index\": %d}}",
               pid, pid);
  for (const auto& [row, name] : s.rows) {
    std::fprintf(
        f,
        ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": %s}}",
        pid, row, json_string(name).c_str());
    std::fprintf(f,
                 ",\n{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                 "\"args\": {\"sort_index\": %d}}",
                 pid, row, row);
  }
  for (const Event& e : s.events) {
    // Integer nanoseconds printed as microseconds: a child's ts + dur never passes its parent's.
    const std::int64_t dur = e.end_ns - e.begin_ns;
    std::fprintf(f,
                 ",\n{\"name\": %s, \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": "
                 "%lld.%03lld, \"dur\": %lld.%03lld",
                 json_string(e.name).c_str(), e.category, pid, e.row, (long long)(e.begin_ns / 1000),
                 (long long)(e.begin_ns % 1000), (long long)(dur / 1000), (long long)(dur % 1000));
    if (!e.args.empty()) std::fprintf(f, ", \"args\": {%s}", e.args.c_str());
    std::fputc('}', f);
  }
  std::fprintf(f,
               "\n],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": {\"rank\": %d, \"steps\": [%lld, %lld], "
               "\"clock\": \"microseconds since a barrier of every rank at the start of training\"%s%s}}\n",
               pid, (long long)s.first, (long long)s.last, s.meta.empty() ? "" : ", ", s.meta.c_str());
  const bool ok = !std::ferror(f);
  return std::fclose(f) == 0 && ok;
}

}  // namespace

void open(MPI_Comm comm, const std::string& path, std::int64_t first, std::int64_t last,
          const std::string& process, const std::string& meta) {
  Session& s = session();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.open = true;
    s.written = false;
    s.path = path;
    s.process = process;
    s.meta = meta;
    s.first = first;
    s.last = last;
    s.events.clear();
    s.rows = {{kMainRow, "main"}};
    MPI_CHECK(MPI_Comm_rank(comm, &s.rank));
  }
  {
    watchdog::Collective guard("the timeline's start (io.trace)");
    MPI_CHECK(MPI_Barrier(comm));
  }
  s.origin = std::chrono::steady_clock::now();
}

void name_row(int row, const std::string& name) {
  Session& s = session();
  std::lock_guard<std::mutex> lock(s.mu);
  s.rows[row] = name;
}

std::string begin_step(std::int64_t step) {
  Session& s = session();
  if (!s.open || s.written) return "";
  const bool in = step >= s.first && step <= s.last;
  g_recording.store(in, std::memory_order_relaxed);
  return step > s.last ? close() : "";
}

std::string close() {
  Session& s = session();
  g_recording.store(false, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.open || s.written || s.events.empty()) return "";
  s.written = true;
  if (!write_file(s)) {
    log::warn("io.trace: cannot write '" + s.path + "'");
    return "";
  }
  s.events.clear();
  return s.path;
}

bool recording() { return g_recording.load(std::memory_order_relaxed); }

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              session().origin)
      .count();
}

void record(const std::string& name, const char* category, int row, std::int64_t begin_ns,
            std::int64_t end_ns, const std::string& args) {
  Session& s = session();
  std::lock_guard<std::mutex> lock(s.mu);
  s.events.push_back({name, category, row, begin_ns, std::max(end_ns, begin_ns), args});
}

void record_bucket(std::size_t bucket, std::int64_t bytes, std::int64_t begin_ns, std::int64_t end_ns) {
  record("all-reduce b" + std::to_string(bucket), "comm", kBucketRow + int(bucket), begin_ns, end_ns,
         "\"bucket\": " + std::to_string(bucket) + ", \"bytes\": " + std::to_string(bytes));
}

}  // namespace ddp::trace
