#include "comm/mpi_wait.hpp"

namespace ddp {

int wait_for(MPI_Request& request) {
  int rc = MPI_SUCCESS;
  poll_until([&] {
    int done = 0;
    rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    return rc != MPI_SUCCESS || done != 0;
  });
  return rc;
}

int bcast_waiting(void* data, int count, MPI_Datatype type, int root, MPI_Comm comm) {
  MPI_Request request = MPI_REQUEST_NULL;
  const int rc = MPI_Ibcast(data, count, type, root, comm, &request);
  return rc == MPI_SUCCESS ? wait_for(request) : rc;
}

int allreduce_waiting(const void* in, void* out, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  MPI_Request request = MPI_REQUEST_NULL;
  const int rc = MPI_Iallreduce(in, out, count, type, op, comm, &request);
  return rc == MPI_SUCCESS ? wait_for(request) : rc;
}

int barrier_waiting(MPI_Comm comm) {
  MPI_Request request = MPI_REQUEST_NULL;
  const int rc = MPI_Ibarrier(comm, &request);
  return rc == MPI_SUCCESS ? wait_for(request) : rc;
}

}  // namespace ddp
