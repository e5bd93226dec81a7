// ckpt_bench: two ways to write a ZeRO-sharded optimizer state whole into one HDF5
// file, timed on the same state in the same run (issue 25 asks to measure both and
// choose):
//
//   mpirun -np W ckpt_bench [MB] [repeats] [dir]     (defaults: 100 MB, 5, /tmp)
//
//  gather:   every rank sends its share to rank 0 (MPI_Gatherv, one dataset at a
//            time, as the trainer does), rank 0 writes the file alone (sec2 driver),
//            fsync; what ddp_train does;
//  parallel: every rank opens the file through MPI-IO (H5Pset_fapl_mpio) and writes
//            its share into its hyperslab of each dataset (collective transfer),
//            H5Fflush, close, then rank 0 fsyncs the file.
//
// The state is two float32 datasets (AdamW's exp_avg and exp_avg_sq) of MB/2 each,
// cut into W shares as comm.zero cuts them (comm/shares.hpp). The two ways alternate
// within each repeat; prints each time, the medians and MB/s. The page cache holds
// what was written: fsync is what makes it durable, and is timed.
#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/gradient_reducer.hpp"  // share_counts
#include "comm/shares.hpp"

namespace {

double now() { return MPI_Wtime(); }

double median_of(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "ckpt_bench: %s failed\n", what);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

void fsync_file(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  check(fd >= 0 && fsync(fd) == 0 && close(fd) == 0, "fsync");
}

const char* kNames[2] = {"exp_avg", "exp_avg_sq"};

double write_gather(const std::string& path, const std::vector<float>& share, const ddp::Shares& s, int rank) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now();
  const hsize_t n = hsize_t(s.bounds.back());
  const ddp::ShareCounts c = ddp::share_counts(s.bounds, 0, s.bounds.back());
  hid_t file = -1;
  if (rank == 0) file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (rank == 0) check(file >= 0, "H5Fcreate");
  for (const char* name : kNames) {
    std::vector<float> whole(rank == 0 ? std::size_t(n) : 0);
    MPI_Gatherv(share.data(), int(share.size()), MPI_FLOAT, whole.data(), c.counts.data(), c.displs.data(),
                MPI_FLOAT, 0, MPI_COMM_WORLD);
    if (rank != 0) continue;
    const hid_t space = H5Screate_simple(1, &n, nullptr);
    const hid_t d = H5Dcreate2(file, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    check(d >= 0 && H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, whole.data()) >= 0, "H5Dwrite");
    H5Dclose(d);
    H5Sclose(space);
  }
  if (rank == 0) {
    H5Fclose(file);
    fsync_file(path);
  }
  MPI_Barrier(MPI_COMM_WORLD);  // every rank may go on once the file is on disk
  return now() - t0;
}

double write_parallel(const std::string& path, const std::vector<float>& share, const ddp::Shares& s, int rank) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now();
  const hsize_t n = hsize_t(s.bounds.back());
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, MPI_COMM_WORLD, MPI_INFO_NULL);
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  check(file >= 0, "H5Fcreate (mpio)");
  H5Pclose(fapl);
  const hid_t xfer = H5Pcreate(H5P_DATASET_XFER);
  H5Pset_dxpl_mpio(xfer, H5FD_MPIO_COLLECTIVE);
  for (const char* name : kNames) {
    const hid_t space = H5Screate_simple(1, &n, nullptr);
    const hid_t d = H5Dcreate2(file, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t start = hsize_t(s.begin(rank)), count = hsize_t(s.size(rank));
    H5Sselect_hyperslab(space, H5S_SELECT_SET, &start, nullptr, &count, nullptr);
    const hid_t mem = H5Screate_simple(1, &count, nullptr);
    check(H5Dwrite(d, H5T_NATIVE_FLOAT, mem, space, xfer, share.data()) >= 0, "H5Dwrite (mpio)");
    H5Sclose(mem);
    H5Dclose(d);
    H5Sclose(space);
  }
  H5Pclose(xfer);
  H5Fflush(file, H5F_SCOPE_GLOBAL);
  H5Fclose(file);
  if (rank == 0) fsync_file(path);
  MPI_Barrier(MPI_COMM_WORLD);
  return now() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const double mb = argc > 1 ? std::atof(argv[1]) : 100.0;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const std::string dir = argc > 3 ? argv[3] : "/tmp";
  // Two datasets of mb/2 each.
  const std::int64_t n = std::int64_t(mb * 1024.0 * 1024.0 / 8.0);
  const ddp::Shares s = ddp::Shares::split(n, size);
  std::vector<float> share(std::size_t(s.size(rank)));
  for (std::size_t i = 0; i < share.size(); ++i) share[i] = float(s.begin(rank) + std::int64_t(i)) * 1e-6f;
  std::vector<double> gather, parallel;
  for (int r = 0; r < repeats; ++r) {
    const std::string g = dir + "/ckpt_bench_gather.h5", p = dir + "/ckpt_bench_parallel.h5";
    // Alternate which goes first.
    if (r % 2 == 0) {
      gather.push_back(write_gather(g, share, s, rank));
      parallel.push_back(write_parallel(p, share, s, rank));
    } else {
      parallel.push_back(write_parallel(p, share, s, rank));
      gather.push_back(write_gather(g, share, s, rank));
    }
    if (rank == 0)
      std::printf("repeat %d: gather to rank 0 %.3f s, parallel HDF5 %.3f s\n", r + 1, gather.back(),
                  parallel.back());
    if (rank == 0) std::remove(g.c_str()), std::remove(p.c_str());
  }
  if (rank == 0) {
    const double total_mb = double(n) * 2.0 * 4.0 / (1024.0 * 1024.0);
    std::printf("ckpt_bench: %.1f MB of optimizer state on %d rank(s) into %s, %d repeats, medians:\n", total_mb,
                size, dir.c_str(), repeats);
    std::printf("  gather to rank 0, one writer: %.3f s (%.0f MB/s)\n", median_of(gather), total_mb / median_of(gather));
    std::printf("  parallel HDF5, every rank:    %.3f s (%.0f MB/s)\n", median_of(parallel),
                total_mb / median_of(parallel));
  }
  MPI_Finalize();
  return 0;
}
