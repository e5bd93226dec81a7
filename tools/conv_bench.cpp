// Prints the time and GFLOP/s of the convolutions of inputs/fashion_cnn.nml at batch
// 64 (forward, backward weights, backward data) on the compute backend: oneDNN on
// one thread unless OMP_NUM_THREADS / DDP_DNNL_THREADS say otherwise, or cuDNN on
// the GPU in the CUDA build. A program, not a test:
//   build/conv_bench [batch] [repeats]
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "layer_fixture.hpp"
#include "model/backend.hpp"
#include "model/conv2d.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  {
    using namespace ddp;
    const std::int64_t B = argc > 1 ? std::atoll(argv[1]) : 64;
    const int reps = argc > 2 ? std::atoi(argv[2]) : 50;
    struct Case {
      const char* spec;
      Shape in;
    } cases[] = {{"conv2d(32, 3, pad=1)", {1, 28, 28}}, {"conv2d(64, 3, pad=1)", {32, 14, 14}}};
    double total_ms = 0;
    for (const Case& c : cases) {
      test::BoundLayer b(c.spec, c.in);
      Tensor x = test::make_tensor(b.batch_shape(B, c.in), test::random_values(B * shape_numel(c.in), 1)), y,
             dx;
      b.layer->forward(x, y, true);
      Tensor dy = test::make_tensor(y.shape, test::random_values(y.numel(), 2));
      const double flops = static_cast<Conv2d*>(b.layer.get())->forward_flops(B);
      auto time_ms = [&](auto&& f) {
        f();  // warm-up: primitive creation
        compute_backend().synchronize();
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; ++i) f();
        compute_backend().synchronize();
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
               reps;
      };
      double fwd = time_ms([&] { b.layer->forward(x, y, true); });
      b.layer->set_needs_input_grad(false);
      double bwd_w = time_ms([&] { b.layer->backward(x, y, dy, dx); });
      b.layer->set_needs_input_grad(true);
      double bwd_all = time_ms([&] { b.layer->backward(x, y, dy, dx); });
      double bwd_d = bwd_all - bwd_w;
      std::printf(
          "%-22s in %-13s B %lld: fwd %.3f ms (%.1f GFLOP/s)  bwd-weights %.3f ms (%.1f)  bwd-data %.3f ms "
          "(%.1f)\n",
          c.spec, shape_str(c.in).c_str(), static_cast<long long>(B), fwd, flops / fwd / 1e6, bwd_w,
          flops / bwd_w / 1e6, bwd_d, flops / bwd_d / 1e6);
      // The CNN needs no input gradient for its first conv.
      total_ms += fwd + bwd_w + (c.in[0] == 1 ? 0.0 : bwd_d);
    }
    std::printf("%s; conv time per step %.3f ms -> at most %.0f samples/s per rank from convs alone\n",
                compute_backend().name().c_str(), total_ms, B / total_ms * 1e3);
  }
  Kokkos::finalize();
  MPI_Finalize();
}
