#include "comm/check.hpp"

#include <hdf5.h>
#include <unistd.h>

#include <cstdio>

namespace ddp {

namespace {
int world_rank() {
  int initialized = 0, finalized = 0, rank = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

[[noreturn]] void abort_all(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}
}  // namespace

void fatal(const char* file, int line, const std::string& msg) {
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  std::fprintf(stderr, "rank %d (%s): %s:%d: %s\n", world_rank(), host, file, line, msg.c_str());
  std::fflush(stderr);
  abort_all(1);
}

void fatal_all(MPI_Comm comm, const std::string& msg) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0) {
    std::fprintf(stderr, "error: %s\n", msg.c_str());
    std::fflush(stderr);
    abort_all(1);
  }
  // Rank 0 aborts the job; waiting here keeps this rank from racing it to the abort
  // and printing nothing useful. Should rank 0 be gone, abort anyway.
  MPI_Barrier(comm);
  abort_all(1);
}

void fatal_if_any(MPI_Comm comm, bool failed, const std::string& msg) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int mine = failed ? rank : size, first = size;
  MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == size) return;
  if (rank == first) {
    std::fprintf(stderr, "error: %s%s\n", size > 1 ? ("rank " + std::to_string(rank) + ": ").c_str() : "",
                 msg.c_str());
    std::fflush(stderr);
    abort_all(1);
  }
  MPI_Barrier(comm);
  abort_all(1);
}

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, len);
}

namespace {
herr_t innermost(unsigned n, const H5E_error2_t* err, void* out) {
  if (n == 0) {
    auto* s = static_cast<std::string*>(out);
    *s = std::string(err->func_name) + ": " + (err->desc ? err->desc : "");
  }
  return 0;
}
}  // namespace

std::string h5_error_string() {
  std::string s = "HDF5 error";
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, &s);
  return s;
}

}  // namespace ddp
