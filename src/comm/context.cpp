#include "comm/context.hpp"

#include <Kokkos_Core.hpp>
#include <cstdlib>
#include <string>

#include "comm/check.hpp"
#include "comm/fault_injection.hpp"
#include "comm/log.hpp"
#if defined(KOKKOS_ENABLE_CUDA)
#include "cuda/device.hpp"
#endif

namespace ddp {

Launch launch_from_environment(const char* (*getenv)(const char*)) {
  static const struct {
    const char *size, *rank, *launcher;
  } kinds[] = {
      {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "Open MPI's mpirun"},
      {"PMI_SIZE", "PMI_RANK", "an MPICH-style launcher (MPICH's or Intel MPI's mpiexec, srun --mpi=pmi2)"},
      {"SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "srun"}};
  for (const auto& k : kinds) {
    const char* size = getenv(k.size);
    if (!size || !*size) continue;
    const char* rank = getenv(k.rank);
    Launch l;
    l.tasks = std::atoi(size);
    l.task = rank ? std::atoi(rank) : 0;
    l.variable = k.size;
    l.launcher = k.launcher;
    return l;
  }
  return {};
}

std::string separate_jobs_problem(const Launch& launch, int world_size) {
  if (world_size != 1 || launch.tasks <= 1) return "";
  const std::string n = std::to_string(launch.tasks);
  const std::string what =
      launch.variable == "SLURM_STEP_NUM_TASKS"
          ? "srun did not give MPI the ranks: Open MPI needs srun --mpi=pmix (or export "
            "SLURM_MPI_TYPE=pmix), "
            "MPICH and Intel MPI --mpi=pmi2; `srun --mpi=list` shows what this Slurm has. Or start ddp_train "
            "with the mpirun of the MPI it was built with"
          : "ddp_train was built with another MPI than that launcher's: start it with the mpirun of the MPI "
            "it "
            "was built with (ddp_train --version names it), or with srun";
  return launch.launcher + " started " + n + " tasks (" + launch.variable + "=" + n +
         "), but MPI made each of them a job of 1 rank, so each would train a run of its own: " + what;
}

Context::Context(int& argc, char**& argv, Start start) {
  // From here on an exception nobody catches, on any thread, is one line and an
  // MPI_Abort (see check.hpp), not `terminate called` and a stack dump.
  install_terminate_handler();
  // Before MPI_Init, which may set such variables of its own.
  const Launch launch = launch_from_environment([](const char* v) -> const char* { return std::getenv(v); });
  MPI_CHECK(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &thread_level_));
  // Errors come back as codes and go through MPI_CHECK, which names the call.
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world_));
  make_exit_communicator();
  MPI_CHECK(MPI_Comm_rank(world_, &rank_));
  MPI_CHECK(MPI_Comm_size(world_, &size_));
  log::set_rank(rank_);
  // Every task is rank 0 of a job of its own: the launcher's first one says why.
  if (const std::string problem = separate_jobs_problem(launch, size_); !problem.empty())
    fatal_all(world_, problem, /*say=*/launch.task == 0);
  check_test_variables(world_);  // tests only

  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
  MPI_CHECK(MPI_Comm_size(node, &local_size_));
  MPI_CHECK(MPI_Comm_free(&node));
  if (start == Start::mpi_and_kokkos) start_kokkos(argc, argv);
}

void Context::start_kokkos(int& argc, char**& argv) {
#if defined(KOKKOS_ENABLE_CUDA)
  // One GPU per rank: from Slurm's binding or CUDA_VISIBLE_DEVICES when they leave
  // one visible, else node-local rank modulo the devices (comm/backend.hpp,
  // pick_device). Kokkos is told the same device; it would pick by its own rules.
  const DeviceChoice device = cuda::bind_device(local_rank_);
  if (device.device < 0)
    DDP_FATAL("this is the GPU build of ddp_train, and this rank finds " << device.reason
                                                                         << ": run it on a GPU node");
  setenv("KOKKOS_DEVICE_ID", std::to_string(device.device).c_str(), 1);
  device_ = device.reason;
#endif
  Kokkos::initialize(argc, argv);
}

Context::~Context() {
  if (Kokkos::is_initialized()) Kokkos::finalize();
  // The last synchronisation: no rank leaves before every rank has torn down what it
  // had (main's objects, Kokkos). A launcher that treats the first exit 75 as a failed
  // job (mpirun; srun --kill-on-bad-exit) then finds the other ranks past this point,
  // where its SIGTERM ends them with 75 too (train/signals.hpp). Open MPI's
  // MPI_Finalize holds a fence of its own; the barrier does not rely on that.
  MPI_CHECK(MPI_Barrier(world_));
  MPI_Comm_free(&world_);
  MPI_Finalize();
  inject_exit_delay();  // tests only: a slow exit
}

}  // namespace ddp
