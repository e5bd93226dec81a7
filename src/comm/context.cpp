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

Context::Context(int& argc, char**& argv, Start start) {
  // From here on an exception nobody catches, on any thread, is one line and an
  // MPI_Abort (see check.hpp), not `terminate called` and a stack dump.
  install_terminate_handler();
  MPI_CHECK(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &thread_level_));
  // Errors come back as codes and go through MPI_CHECK, which names the call.
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world_));
  MPI_CHECK(MPI_Comm_rank(world_, &rank_));
  MPI_CHECK(MPI_Comm_size(world_, &size_));
  log::set_rank(rank_);
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
