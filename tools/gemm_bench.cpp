// Times ddp::gemm on the GEMM shapes of one training step of inputs/fashion_mlp.nml
// (batch 64: forward, weight gradients, input gradients) in fp32, bf16 and fp16
// (src/model/precision.hpp), and OpenBLAS's cblas_sgemm on the same shapes when it
// was found at build time. One thread unless OMP_NUM_THREADS / DDP_DNNL_THREADS say
// otherwise. A program that prints numbers, not a test:
//   build/gemm_bench [batch] [repeats]
#include <Kokkos_Core.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "model/gemm.hpp"
#include "model/onednn/dnnl_engine.hpp"

#if DDP_GEMM_BENCH_OPENBLAS
#include <cblas.h>
extern "C" char* openblas_get_corename(void);
#endif

namespace {

double seconds_per_call(int repeats, const std::function<void()>& f) {
  for (int i = 0; i < 10; ++i) f();  // warm-up: primitive creation, caches
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / repeats;
}

}  // namespace

int main(int argc, char** argv) {
  using ddp::Precision;
  Kokkos::ScopeGuard kokkos(argc, argv);  // the compute backend is made after Kokkos::initialize
  const int B = argc > 1 ? std::atoi(argv[1]) : 64;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 300;
  struct Shape {
    bool ta, tb;
    int m, n, k;
    const char* what;
  };
  // 784-256-256-10: y = x W^T; dW = dy^T x; dx = dy W (not for the first layer).
  const std::vector<Shape> shapes = {
      {false, true, B, 256, 784, "fwd  linear 1"},  {false, true, B, 256, 256, "fwd  linear 2"},
      {false, true, B, 10, 256, "fwd  linear 3"},   {true, false, 10, 256, B, "dW   linear 3"},
      {false, false, B, 256, 10, "dx   linear 3"},  {true, false, 256, 256, B, "dW   linear 2"},
      {false, false, B, 256, 256, "dx   linear 2"}, {true, false, 256, 784, B, "dW   linear 1"},
  };
#if DDP_GEMM_BENCH_OPENBLAS
  openblas_set_num_threads(1);
  std::printf("OpenBLAS core: %s\n", openblas_get_corename());
#endif
  std::printf("oneDNN threads: %d; batch %d; %d calls each\n", ddp::dnnl_threads(), B, repeats);
  std::printf("%-14s %-14s %17s %17s %17s", "GEMM", "m x n x k", "fp32 us (GF/s)", "bf16 us (GF/s)",
              "fp16 emu us");
#if DDP_GEMM_BENCH_OPENBLAS
  std::printf(" %17s", "OpenBLAS us");
#endif
  std::printf("\n");
  double total[4] = {0, 0, 0, 0};
  for (const Shape& s : shapes) {
    const int a_rows = s.ta ? s.k : s.m, a_cols = s.ta ? s.m : s.k;
    const int b_rows = s.tb ? s.n : s.k, b_cols = s.tb ? s.k : s.n;
    std::vector<float> a(std::size_t(a_rows) * a_cols), b(std::size_t(b_rows) * b_cols),
        c(std::size_t(s.m) * s.n);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = float(int(i % 17) - 8) * 0.01f;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = float(int(i % 13) - 6) * 0.01f;
    const double flops = 2.0 * s.m * s.n * s.k;
    double t[4] = {0, 0, 0, 0};
    const Precision precisions[3] = {Precision::fp32, Precision::bf16, Precision::fp16};
    for (int p = 0; p < 3; ++p)
      t[p] = seconds_per_call(repeats, [&] {
        ddp::gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), a_cols, b.data(), b_cols, 0.0f, c.data(), s.n,
                  precisions[p]);
      });
    std::printf("%-14s %4dx%4dx%4d %8.1f (%6.1f) %8.1f (%6.1f) %8.1f         ", s.what, s.m, s.n, s.k,
                t[0] * 1e6, flops / t[0] * 1e-9, t[1] * 1e6, flops / t[1] * 1e-9, t[2] * 1e6);
#if DDP_GEMM_BENCH_OPENBLAS
    t[3] = seconds_per_call(repeats, [&] {
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.m, s.n,
                  s.k, 1.0f, a.data(), a_cols, b.data(), b_cols, 0.0f, c.data(), s.n);
    });
    std::printf(" %8.1f (%6.1f)", t[3] * 1e6, flops / t[3] * 1e-9);
#endif
    std::printf("\n");
    for (int p = 0; p < 4; ++p) total[p] += t[p];
  }
  std::printf("one MLP step's GEMMs: fp32 %.1f us, bf16 %.1f us, fp16 (emulated) %.1f us", total[0] * 1e6,
              total[1] * 1e6, total[2] * 1e6);
#if DDP_GEMM_BENCH_OPENBLAS
  std::printf(", OpenBLAS fp32 %.1f us", total[3] * 1e6);
#endif
  std::printf("\n");
}
