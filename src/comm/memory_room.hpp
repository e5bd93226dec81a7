#pragma once
// How much memory this process's node can still give it: the room under the memory
// limit of its cgroup and every cgroup above it (Slurm's --mem, a container's limit;
// cgroup v1 or v2), and the node's MemAvailable. Past a cgroup's limit the kernel's
// out-of-memory killer ends a rank with SIGKILL and no word from the program; a
// preload is checked against this before it takes the memory.

#include <cstdint>
#include <string>

namespace ddp {

struct MemoryRoom {
  std::int64_t free = -1;   // bytes that can still be taken; -1: nothing known
  std::int64_t limit = -1;  // the limit `free` is counted under (a cgroup's, or MemTotal)
  std::string what;         // what that limit is, for a line: "the memory limit of cgroup /slurm/uid_0/job_7
                            // (memory.limit_in_bytes)" or "the node's MemAvailable"
};

// From /proc/self/cgroup, /proc/self/mountinfo and /proc/meminfo.
MemoryRoom memory_room();

// The same from those files' texts, every path of mountinfo read under `root`
// ("" on a live system; a made-up tree in the tests).
MemoryRoom memory_room_from(const std::string& self_cgroup, const std::string& mountinfo,
                            const std::string& meminfo, const std::string& root);

// The GPU build's start-up check: the line where a GPU (`device`, e.g. "GPU
// 0000:3B:00.0", held by `ranks` ranks, `rank` the lowest) has less free than the
// run still puts there (their optimizer state and activations, as the memory line
// counts them: a floor), or "" where it has enough or `free` is unknown (-1). Before,
// a model too large for the GPU ended inside its first step, in a failed allocation.
std::string short_on_device(int rank, int ranks, const std::string& device, std::int64_t optimizer_state,
                            std::int64_t activations, std::int64_t free, std::int64_t total);

}  // namespace ddp
