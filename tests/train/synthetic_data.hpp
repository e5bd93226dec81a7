#pragma once
// Small classification data sets written as real HDF5 shards, for MPI tests.

#include <hdf5.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::test {

// Rank 0 writes `path` with /x float32 (n, features) and /y int64 (n) in
// [0, classes): a learnable problem (the label is the argmax of a fixed linear
// map of x) with deterministic values. Collective (ends with a barrier).
inline void write_classification_shard(MPI_Comm comm, const std::string& path, std::int64_t n, int features,
                                       int classes, std::uint64_t seed) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0) {
    std::vector<float> x(static_cast<std::size_t>(n * features));
    std::vector<std::int64_t> y(static_cast<std::size_t>(n));
    std::uint64_t s = seed * 2654435761u + 12345u;
    auto next = [&s] {  // LCG: enough for test data
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      return float((s >> 40) & 0xffffff) / float(0x1000000) * 2.0f - 1.0f;
    };
    for (auto& v : x) v = next();
    for (std::int64_t i = 0; i < n; ++i) {
      int best = 0;
      float best_score = -1e30f;
      for (int c = 0; c < classes; ++c) {
        float score = 0.0f;
        for (int f = 0; f < features; ++f)
          score += x[std::size_t(i * features + f)] * std::sin(float(c * 7 + f));
        if (score > best_score) best_score = score, best = c;
      }
      y[std::size_t(i)] = best;
    }
    hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t xdims[2] = {hsize_t(n), hsize_t(features)}, ydims[1] = {hsize_t(n)};
    hid_t xs = H5Screate_simple(2, xdims, nullptr), ys = H5Screate_simple(1, ydims, nullptr);
    hid_t xd = H5Dcreate2(file, "x", H5T_IEEE_F32LE, xs, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t yd = H5Dcreate2(file, "y", H5T_STD_I64LE, ys, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(xd, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data());
    H5Dwrite(yd, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, y.data());
    H5Dclose(xd), H5Dclose(yd), H5Sclose(xs), H5Sclose(ys), H5Fclose(file);
  }
  MPI_Barrier(comm);
}

// A directory every rank agrees on, under the test's working directory.
inline std::string shared_test_dir(MPI_Comm comm, const std::string& name) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  return "test_data_" + name + "_np" + std::to_string(size);
}

}  // namespace ddp::test
