#include "comm/memory_room.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "comm/bytes_text.hpp"

namespace ddp {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> w;
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

// A count as the kernel writes it; -1 for anything else.
std::int64_t number(const std::string& w) {
  char* end = nullptr;
  const long long v = std::strtoll(w.c_str(), &end, 10);
  return end != w.c_str() && *end == 0 && v >= 0 ? v : -1;
}

// "total_rss 123\n..." or "MemAvailable:  42 kB\n...": the number after `key`; -1 if absent.
std::int64_t field(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const std::vector<std::string> w = words(line);
    if (w.size() >= 2 && w[0] == key) {
      const std::int64_t v = number(w[1]);
      return v >= 0 && w.size() > 2 && w[2] == "kB" ? v * 1024 : v;
    }
  }
  return -1;
}

// A limit file's value; -1 for none ("max", v1's page-rounded LONG_MAX, or no file).
std::int64_t limit_in(const std::string& path) {
  const std::vector<std::string> w = words(read_text(path));
  if (w.empty() || w[0] == "max") return -1;
  const std::int64_t v = number(w[0]);
  return v >= (std::int64_t(1) << 62) ? -1 : v;
}

struct Hierarchy {
  bool v2 = false;
  std::string mount, rel;  // the mount point, and this process's cgroup under it ("/a/b")
};

// Where this process's memory cgroup is: v1's memory controller where one is
// mounted, else the v2 tree (whose files say whether it has the memory controller).
bool find_hierarchy(const std::string& self_cgroup, const std::string& mountinfo, Hierarchy* h) {
  std::string v1_path, v2_path;
  bool v1 = false, v2 = false;
  std::istringstream cg(self_cgroup);
  for (std::string line; std::getline(cg, line);) {  // "4:memory:/slurm/uid_0/job_7" or "0::/user.slice"
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
    if (controllers.find(",memory,") != std::string::npos) v1 = true, v1_path = line.substr(b + 1);
    if (line.compare(0, 3, "0::") == 0) v2 = true, v2_path = line.substr(b + 1);
  }
  std::istringstream mi(mountinfo);
  Hierarchy found[2];
  bool have[2] = {false, false};
  for (std::string line; std::getline(mi, line);) {
    // "36 35 0:30 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory"
    const std::vector<std::string> w = words(line);
    std::size_t dash = 0;
    while (dash < w.size() && w[dash] != "-") ++dash;
    if (w.size() < 5 || dash + 3 > w.size()) continue;
    const std::string& root = w[3];
    const std::string& fstype = w[dash + 1];
    const std::string options = "," + w[dash + 3] + ",";
    const bool is_v1 = fstype == "cgroup" && options.find(",memory,") != std::string::npos;
    const bool is_v2 = fstype == "cgroup2";
    if (!(is_v1 && v1) && !(is_v2 && v2)) continue;
    const std::string& path = is_v1 ? v1_path : v2_path;
    // A container's mount of a subtree: its root is a prefix of the cgroup's path.
    const std::string prefix = root == "/" ? "" : root;
    if (path.compare(0, prefix.size(), prefix) != 0) continue;
    Hierarchy& f = found[is_v1 ? 0 : 1];
    f.v2 = is_v2;
    f.mount = w[4];
    f.rel = path.substr(prefix.size());
    if (f.rel == "/") f.rel.clear();
    have[is_v1 ? 0 : 1] = true;
  }
  if (!have[0] && !have[1]) return false;
  *h = have[0] ? found[0] : found[1];
  return true;
}

}  // namespace

MemoryRoom memory_room_from(const std::string& self_cgroup, const std::string& mountinfo,
                            const std::string& meminfo, const std::string& root) {
  MemoryRoom room;
  const std::int64_t available = field(meminfo, "MemAvailable:");
  if (available >= 0) {
    room.free = available;
    room.limit = field(meminfo, "MemTotal:");
    room.what = "the node's available memory (MemAvailable of " + mib_text(double(room.limit)) + " in all)";
  }
  Hierarchy h;
  if (!find_hierarchy(self_cgroup, mountinfo, &h)) return room;
  const char* limit_file = h.v2 ? "memory.max" : "memory.limit_in_bytes";
  // This cgroup and each above it up to the mount: the tightest room of them all.
  for (std::string rel = h.rel;; rel = rel.substr(0, rel.rfind('/'))) {
    const std::string dir = root + h.mount + rel;
    const std::int64_t limit = limit_in(dir + "/" + limit_file);
    if (limit >= 0) {
      // What cannot be given back: anonymous memory and shared memory (tmpfs,
      // /dev/shm); the page cache is reclaimed before the killer runs.
      const std::string stat = read_text(dir + "/memory.stat");
      const std::int64_t anon = field(stat, h.v2 ? "anon" : "total_rss");
      const std::int64_t shmem = field(stat, h.v2 ? "shmem" : "total_shmem");
      const std::int64_t free = limit - std::max<std::int64_t>(anon, 0) - std::max<std::int64_t>(shmem, 0);
      if (room.free < 0 || free < room.free) {
        room.free = free;
        room.limit = limit;
        room.what = "the memory limit of cgroup " + (rel.empty() ? std::string("/") : rel) + " (" +
                    limit_file + " " + mib_text(double(limit)) + ")";
      }
    }
    if (rel.empty()) break;
  }
  return room;
}

MemoryRoom memory_room() {
  return memory_room_from(read_text("/proc/self/cgroup"), read_text("/proc/self/mountinfo"),
                          read_text("/proc/meminfo"), "");
}

std::string short_on_device(int rank, int ranks, const std::string& device, std::int64_t optimizer_state,
                            std::int64_t activations, std::int64_t free, std::int64_t total) {
  const std::int64_t need = optimizer_state + activations;
  if (free < 0 || need <= free) return {};
  const std::string whose = ranks > 1 ? "the " + device + " that rank " + std::to_string(rank) + " and " +
                                            std::to_string(ranks - 1) + " other rank(s) share"
                                      : "rank " + std::to_string(rank) + "'s " + device;
  return "the run needs " + mib_text(double(need)) + " more on " + whose + " (optimizer state " +
         mib_text(double(optimizer_state)) + " and activations " + mib_text(double(activations)) +
         ", as the memory line counts them) and " + mib_text(double(free)) + " of its " +
         mib_text(double(total)) +
         " is free: lower train.batch_size, set comm.zero = 1, or run on GPUs with more memory";
}

}  // namespace ddp
