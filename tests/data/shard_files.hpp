#pragma once
// Test shards with known contents, written with the serial HDF5 C API, and a
// temporary directory shared by every rank.
// Sample g (global index) holds x[g, k] = x_value(g, k), y[g] = g % classes,
// or targets y[g, t] = target_value(g, t), so any read can be checked exactly.

#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::test {

inline std::uint8_t x_u8(std::int64_t g, std::int64_t k) { return std::uint8_t((g * 7 + k) % 256); }
inline float x_f32(std::int64_t g, std::int64_t k) { return float(g * 1000 + k); }
inline float target_value(std::int64_t g, std::int64_t t) { return -float(g) - 0.5f * float(t); }

struct ShardSpec {
  std::int64_t first = 0;  // global index of the first sample (for the values)
  std::int64_t count = 0;
  std::vector<hsize_t> sample_shape;  // /x dims after N
  bool x_uint8 = true;
  hid_t x_type = -1;   // override /x's file type (error tests); -1: from x_uint8
  bool labels = true;  // /y int64 (N) labels, else float32 (N, target...)
  std::vector<hsize_t> target_shape{1};
  std::int64_t classes = 10;
  bool write_x = true, write_y = true;
  std::int64_t y_count = -1;  // -1: same as count
};

// Writes one shard (call on one rank).
void write_shard(const std::string& path, const ShardSpec& spec);

// Rank 0 makes a fresh directory under /tmp; every rank gets its name.
std::string make_shared_tmpdir(MPI_Comm comm);
// Rank 0 removes it after a barrier.
void remove_shared_tmpdir(MPI_Comm comm, const std::string& dir);

}  // namespace ddp::test
