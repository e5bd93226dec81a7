#pragma once
// The one oneDNN CPU engine and stream of a process. oneDNN (Debian: OpenMP runtime)
// runs on ONE thread per rank unless OMP_NUM_THREADS or DDP_DNNL_THREADS is set,
// because ranks are processes pinned one per core; a hybrid run sets either one.

#include <dnnl.hpp>

namespace ddp {

dnnl::engine& dnnl_engine();
dnnl::stream& dnnl_stream();

// Threads oneDNN primitives use (after the first dnnl_engine() call).
int dnnl_threads();

}  // namespace ddp
