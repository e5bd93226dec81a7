#include "model/dnnl_engine.hpp"

#include <omp.h>

#include <cstdlib>

namespace ddp {

namespace {
struct DnnlContext {
  dnnl::engine engine;
  dnnl::stream stream;
  int threads;

  DnnlContext() {
    const char* ddp_threads = std::getenv("DDP_DNNL_THREADS");
    if (ddp_threads && std::atoi(ddp_threads) > 0)
      threads = std::atoi(ddp_threads);
    else if (!std::getenv("OMP_NUM_THREADS"))
      threads = 1;
    else
      threads = omp_get_max_threads();
    engine = dnnl::engine(dnnl::engine::kind::cpu, 0);
    stream = dnnl::stream(engine);
  }
};

DnnlContext& context() {
  static DnnlContext c;
  return c;
}
}  // namespace

dnnl::engine& dnnl_engine() { return context().engine; }

// OpenMP's thread count is a per-thread setting, and the trainer may run layers on
// more than one thread (training, validation): each sets it once, here. Without
// this a rank's oneDNN calls would use every core, and 2 ranks on 2 cores spin-wait
// against each other (3x slower measured).
dnnl::stream& dnnl_stream() {
  DnnlContext& c = context();
  thread_local const bool pinned = (omp_set_num_threads(c.threads), true);
  (void)pinned;
  return c.stream;
}
int dnnl_threads() { return context().threads; }

}  // namespace ddp
