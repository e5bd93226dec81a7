#pragma once
// The run's parallel context: MPI (world, node-local rank) and Kokkos, set up in
// the constructor (Kokkos, in ddp_train, by start_kokkos() after the command line)
// and torn down in the destructor, in the right order. Constructed
// first in main, it is destroyed last: its destructor's barrier before MPI_Finalize
// is the ranks' last synchronisation, so every rank has finished its teardown before
// any exits (a launcher may take the first exit 75 for a failed job).

#include <mpi.h>

#include <string>

namespace ddp {

// What the launcher says of the tasks it started, read from the environment it gives
// each (before MPI starts): Open MPI's mpirun (OMPI_COMM_WORLD_SIZE, _RANK), an
// MPICH-style one (PMI_SIZE, PMI_RANK: MPICH's and Intel MPI's mpiexec, srun
// --mpi=pmi2), else srun's own (SLURM_STEP_NUM_TASKS, SLURM_PROCID). tasks 0: none
// said. `getenv` is std::getenv but in tests.
struct Launch {
  int tasks = 0;
  int task = 0;
  std::string variable;  // "SLURM_STEP_NUM_TASKS"
  std::string launcher;  // "srun"
};
Launch launch_from_environment(const char* (*getenv)(const char*));

// Where the launcher started several tasks and MPI made each a job of one rank (MPI
// did not get the ranks from the launcher: srun without the MPI's PMI plugin, or
// another MPI's mpirun), the line that says so and what to do; else "". Each task
// would train a run of its own, all in one run directory.
std::string separate_jobs_problem(const Launch& launch, int world_size);

class Context {
 public:
  // What the constructor starts. ddp_train starts MPI alone, reads its command line
  // (--help, --version, --keys, --man print and exit without Kokkos, so without a GPU
  // in the GPU build), then calls start_kokkos().
  enum class Start { mpi_and_kokkos, mpi_only };
  explicit Context(int& argc, char**& argv, Start start = Start::mpi_and_kokkos);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  MPI_Comm world() const { return world_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // rank within this node
  int local_size() const { return local_size_; }
  // The prefetch thread may make MPI-IO calls while the main thread runs
  // collectives only if MPI granted MPI_THREAD_MULTIPLE.
  bool thread_multiple() const { return thread_level_ >= MPI_THREAD_MULTIPLE; }
  // The GPU build: which device this rank bound and why ("device 1 of 4 (local
  // rank 5)"); empty in the CPU build.
  const std::string& device() const { return device_; }

  // Binds this rank's GPU (the GPU build), then Kokkos::initialize, which takes the
  // --kokkos-* options out of argv (--kokkos-help: Kokkos prints its options).
  void start_kokkos(int& argc, char**& argv);

 private:
  MPI_Comm world_ = MPI_COMM_NULL;  // a dup of MPI_COMM_WORLD, errors returned
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  int thread_level_ = MPI_THREAD_SINGLE;
  std::string device_;
};

}  // namespace ddp
