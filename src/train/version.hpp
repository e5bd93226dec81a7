#pragma once
// What `ddp_train --version` prints: version, git revision and the build
// configuration (compiler target, Kokkos backend, MPI library, HDF5, oneDNN, CUDA glue).

#include <string>

namespace ddp {

// Several lines, the first "ddp_train <version>". Safe to call on any rank
// after MPI_Init; asks the libraries actually loaded, not only the headers.
std::string version_text();

}  // namespace ddp
