// GPU self-test of the CUDA glue, run as `mpiexec -n 1|2 gpu_selftest`: cuBLAS GEMM
// and cuDNN convolution against double-precision loops on random inputs, MPI on
// device buffers, and NCCL's collectives and bucketed all-reduce against MPI's (with
// a GPU of its own for each rank, or each rank a host of its own to NCCL through
// tools/nccl_one_gpu; where ranks hold the same GPU those checks cannot run, and the
// test reports skipped once the others have passed).
// Without a CUDA device on every rank it prints "skipped: no CUDA device" and exits
// with DDP_GPU_SKIP_CODE, which CTest reports as skipped (SKIP_RETURN_CODE).
//
// Tolerances (max |gpu - ref| / max |ref| over the output):
//   GEMM fp32 operands            1e-5  against a double-precision loop (fp32 accumulation,
//                                       no TF32: summation order only)
//   GEMM bf16 operands            1e-4  against the loop on the same bf16-rounded operands,
//                                 2e-2  against the loop on the unrounded fp32 operands
//   convolution fp32 (fwd, bwd-data, bwd-filter)  1e-5 against a double-precision loop
//   convolution bf16 channels-last (the GPU's bf16 path)  1e-2 against the loop on
//                                 the same bf16-rounded operands (results stored in bf16:
//                                 2^-8 relative each)
//   the same convolutions through cuDNN's graph API (DDP_CUDNN_GRAPH=1), at the same
//   tolerances, and fp32 with alpha 0.5, beta 1 (1e-5), bf16 backward-data with beta 1
//   (1e-2); the graph API must have run them (in bf16 a 3-channel stem may go to the
//   legacy API). Outputs hold NaN before every call with beta 0.
//   NCHW <-> NHWC moves           bitwise (fp32 round trip); 1e-6 with bias, relu and add
//   conv with batch norm's statistics in one cuDNN graph, bf16 channels-last, with and
//   without the scale-bias-relu prologue: y 1e-2 against the loop on the rounded
//   prologue's result, the per-channel sums of y and y^2 1e-2 of their largest
//   backward-data adding to dx    1e-6 fp32, 1e-2 bf16 against the gradient written alone
//                                 plus what dx held
//   NCCL all-reduce               bitwise equal to MPI_Allreduce on 2 ranks (a + b is
//                                 commutative); 1e-6 on more ranks (summation order)
//   a CUDA graph of backend calls bitwise equal to the same calls run uncaptured, on new
//   (train.cuda_graph's capture)  contents of the same buffers (fp32 and bf16)
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/backend.hpp"
#include "comm/cuda_aware.hpp"
#include "comm/gradient_reducer.hpp"
#include "cuda/conv.hpp"
#include "cuda/conv_epilogue.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device.hpp"
#include "cuda/device_communicator.hpp"
#include "cuda/gemm.hpp"
#include "cuda/nccl_communicator.hpp"
#include "model/precision.hpp"

#ifndef DDP_GPU_SKIP_CODE
#define DDP_GPU_SKIP_CODE 77
#endif

namespace {

int g_rank = 0, g_failures = 0;

void check(const char* what, double err, double tol) {
  bool ok = err <= tol;  // false for a NaN error too
  if (!ok) ++g_failures;
  if (g_rank == 0 || !ok)
    std::printf("rank %d: %-44s rel err %.3g (tol %.1g) %s\n", g_rank, what, err, tol, ok ? "ok" : "FAILED");
}

// The largest difference over the largest reference value; NaN where got holds one (an
// output left unwritten holds the poison's NaN), which check() fails.
template <class A, class B>
double rel_err(const std::vector<A>& got, const std::vector<B>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(double(got[i]) - double(ref[i]));
    if (!(d <= num)) num = d;  // (std::max would drop a NaN)
    den = std::max(den, std::fabs(double(ref[i])));
  }
  return den > 0 ? num / den : num;
}

std::vector<float> random_vector(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(gen);
  return v;
}

// A device copy of a host vector, freed at scope exit.
template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit DeviceBuffer(std::size_t count) : n(count) {
    CUDA_CHECK(cudaMalloc(&ptr, std::max<std::size_t>(n, 1) * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& h) : DeviceBuffer(h.size()) { upload(h); }
  ~DeviceBuffer() { cudaFree(ptr); }
  void upload(const std::vector<T>& h) {
    CUDA_CHECK(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// C = alpha op(A) op(B) + beta C, row-major, in double: the reference.
void reference_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                    const float* b, int ldb, float beta, float* c, int ldc) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int l = 0; l < k; ++l)
        sum += double(ta ? a[l * lda + i] : a[i * lda + l]) * (tb ? b[j * ldb + l] : b[l * ldb + j]);
      c[i * ldc + j] = float(alpha * sum + double(beta) * c[i * ldc + j]);
    }
}

void test_gemm(cudaStream_t stream) {
  ddp::cuda::CublasGemm gemm(stream);
  const int m = 67, n = 45, k = 123;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    const int lda = ta ? m : k, ldb = tb ? k : n, ldc = n;
    std::vector<float> a = random_vector(std::size_t(m) * k, 10 + t),
                       b = random_vector(std::size_t(k) * n, 20 + t);
    std::vector<float> c0 = random_vector(std::size_t(m) * n, 30 + t);
    const float alpha = 0.75f, beta = 0.5f;
    std::string tag = std::string(" ") + (ta ? "T" : "N") + (tb ? "T" : "N");

    std::vector<float> ref = c0;
    reference_gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, ref.data(), ldc);
    DeviceBuffer<float> da(a), db(b), dc(c0);
    gemm(ta, tb, m, n, k, alpha, da.ptr, lda, db.ptr, ldb, beta, dc.ptr, ldc);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    check(("cuBLAS GEMM fp32" + tag).c_str(), rel_err(dc.download(), ref), 1e-5);

    // bf16 operands, fp32 C: the device casts, the CPU rounds the same way.
    DeviceBuffer<std::uint16_t> a16(a.size()), b16(b.size());
    ddp::cuda::convert_from_f32(da.ptr, a16.ptr, ddp::cuda::DType::BF16, a.size(), stream);
    ddp::cuda::convert_from_f32(db.ptr, b16.ptr, ddp::cuda::DType::BF16, b.size(), stream);
    dc.upload(c0);
    gemm(ta, tb, m, n, k, alpha, a16.ptr, lda, b16.ptr, ldb, beta, dc.ptr, ldc, ddp::cuda::DType::BF16,
         ddp::cuda::DType::F32);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> ar = a, br = b, ref16 = c0;
    for (auto& x : ar) x = ddp::round_bf16(x);
    for (auto& x : br) x = ddp::round_bf16(x);
    reference_gemm(ta, tb, m, n, k, alpha, ar.data(), lda, br.data(), ldb, beta, ref16.data(), ldc);
    std::vector<float> got = dc.download();
    check(("cuBLAS GEMM bf16" + tag + " vs rounded operands").c_str(), rel_err(got, ref16), 1e-4);
    check(("cuBLAS GEMM bf16" + tag + " vs fp32").c_str(), rel_err(got, ref), 2e-2);
  }
}

// y (N, K, P, Q) = conv(x (N, C, H, W), w (K, C, R, S)), and the two backward
// products, by the definition, in double.
struct ConvRef {
  std::vector<double> y, dx, dw;
};
ConvRef conv_ref(const ddp::cuda::ConvShape& s, const std::vector<float>& x, const std::vector<float>& w,
                 const std::vector<float>& dy) {
  const int P = s.out_h(), Q = s.out_w();
  ConvRef r{std::vector<double>(std::size_t(s.n) * s.k * P * Q), std::vector<double>(x.size()),
            std::vector<double>(w.size())};
  for (int n = 0; n < s.n; ++n)
    for (int k = 0; k < s.k; ++k)
      for (int p = 0; p < P; ++p)
        for (int q = 0; q < Q; ++q) {
          const std::size_t yi = ((std::size_t(n) * s.k + k) * P + p) * Q + q;
          for (int c = 0; c < s.c; ++c)
            for (int i = 0; i < s.r; ++i)
              for (int j = 0; j < s.s; ++j) {
                const int h = p * s.stride_h - s.pad_h + i * s.dilation_h;
                const int ww = q * s.stride_w - s.pad_w + j * s.dilation_w;
                if (h < 0 || h >= s.h || ww < 0 || ww >= s.w) continue;
                const std::size_t xi = ((std::size_t(n) * s.c + c) * s.h + h) * s.w + ww;
                const std::size_t wi = ((std::size_t(k) * s.c + c) * s.r + i) * s.s + j;
                r.y[yi] += double(x[xi]) * w[wi];
                r.dx[xi] += double(dy[yi]) * w[wi];
                r.dw[wi] += double(dy[yi]) * x[xi];
              }
        }
  return r;
}

// The graph API (DDP_CUDNN_GRAPH=1) must have run the convolutions itself: plans made,
// and at most max_declined left to the legacy API (bf16: a 3-channel stem's three may
// have no engine the rules allow, where the legacy API has last resorts).
void check_graph_ran(const ddp::cuda::CudnnConv& conv, const std::string& tag, int max_declined = 0) {
  check(("graph API plans made" + tag).c_str(), conv.graph_plans() > 0 ? 0.0 : 1.0, 0);
  check(("graph API convolutions declined" + tag).c_str(), double(conv.graph_declined()), max_declined);
}

// Outputs filled with NaN (all bits set) before a call with beta = 0: one that read
// them would show.
template <class T>
void poison(cudaStream_t stream, const DeviceBuffer<T>& b) {
  CUDA_CHECK(cudaMemsetAsync(b.ptr, 0xFF, b.n * sizeof(T), stream));
}

// Both ways of choosing the algorithms: cuDNN's heuristics (the default) and its
// timed search (DDP_CUDNN_BENCHMARK=1); through the legacy API and the graph API.
// With the graph API also alpha 0.5 and beta 1 (a plan of their own): the result
// blended with what the output held.
void test_conv(cudaStream_t stream, ddp::cuda::CudnnConv::Search search, bool graph) {
  ddp::cuda::CudnnConv conv(stream, ddp::cuda::DType::F32, search, false, true, graph);
  const std::string how =
      std::string(search == ddp::cuda::CudnnConv::Search::Benchmark ? " (timed search)" : "") +
      (graph ? " graph API" : "");
  ddp::cuda::ConvShape shapes[3];
  shapes[0] = {2, 3, 9, 9, 4, 3, 3, 1, 1, 1, 1, 1, 1};    // same padding
  shapes[1] = {3, 5, 12, 10, 6, 5, 3, 0, 1, 2, 2, 1, 1};  // strided, uneven
  shapes[2] = {1, 4, 11, 11, 8, 3, 3, 2, 2, 1, 1, 2, 2};  // dilated
  int id = 0;
  for (const auto& s : shapes) {
    for (int pass = 0; pass < 2; ++pass) {  // the second pass reuses the cached plan
      std::vector<float> x = random_vector(std::size_t(s.n) * s.c * s.h * s.w, 100 + id);
      std::vector<float> w = random_vector(std::size_t(s.k) * s.c * s.r * s.s, 200 + id);
      std::vector<float> dy = random_vector(std::size_t(s.n) * s.k * s.out_h() * s.out_w(), 300 + id);
      ConvRef ref = conv_ref(s, x, w, dy);
      DeviceBuffer<float> dx_in(x), dw_in(w), ddy(dy), y(dy.size()), dx(x.size()), dw(w.size());
      for (const DeviceBuffer<float>* out : {&y, &dx, &dw}) poison(stream, *out);
      conv.forward(s, dx_in.ptr, dw_in.ptr, y.ptr);
      conv.backward_data(s, dw_in.ptr, ddy.ptr, dx.ptr);
      conv.backward_filter(s, dx_in.ptr, ddy.ptr, dw.ptr);
      CUDA_CHECK(cudaStreamSynchronize(stream));
      std::string tag = " shape " + std::to_string(id % 3) + (pass ? " (cached)" : "") + how;
      check(("cuDNN conv forward fp32" + tag).c_str(), rel_err(y.download(), ref.y), 1e-5);
      check(("cuDNN conv backward-data fp32" + tag).c_str(), rel_err(dx.download(), ref.dx), 1e-5);
      check(("cuDNN conv backward-filter fp32" + tag).c_str(), rel_err(dw.download(), ref.dw), 1e-5);
      if (!graph) continue;
      // out = 0.5 * result + out's random contents
      const std::vector<float> y0 = random_vector(dy.size(), 700 + id),
                               dx0 = random_vector(x.size(), 800 + id),
                               dw0 = random_vector(w.size(), 900 + id);
      y.upload(y0);
      dx.upload(dx0);
      dw.upload(dw0);
      conv.forward(s, dx_in.ptr, dw_in.ptr, y.ptr, 0.5f, 1.0f);
      conv.backward_data(s, dw_in.ptr, ddy.ptr, dx.ptr, 0.5f, 1.0f);
      conv.backward_filter(s, dx_in.ptr, ddy.ptr, dw.ptr, 0.5f, 1.0f);
      CUDA_CHECK(cudaStreamSynchronize(stream));
      auto blended = [](const std::vector<double>& r, const std::vector<float>& held) {
        std::vector<double> b(r.size());
        for (std::size_t i = 0; i < r.size(); ++i) b[i] = 0.5 * r[i] + held[i];
        return b;
      };
      check(("cuDNN conv forward fp32 alpha 0.5 beta 1" + tag).c_str(),
            rel_err(y.download(), blended(ref.y, y0)), 1e-5);
      check(("cuDNN conv backward-data fp32 alpha 0.5 beta 1" + tag).c_str(),
            rel_err(dx.download(), blended(ref.dx, dx0)), 1e-5);
      check(("cuDNN conv backward-filter fp32 alpha 0.5 beta 1" + tag).c_str(),
            rel_err(dw.download(), blended(ref.dw, dw0)), 1e-5);
    }
    ++id;
  }
  if (graph) check_graph_ran(conv, " fp32" + how);
}

// MPI on device buffers (staged, and direct where MPI is CUDA-aware) against MPI on
// host buffers.
void test_device_mpi(MPI_Comm world, cudaStream_t compute) {
  const std::size_t n = (std::size_t(1) << 20) + 3;
  std::vector<float> mine = random_vector(n, 1000 + g_rank), ref(n);
  MPI_CHECK(MPI_Allreduce(mine.data(), ref.data(), int(n), MPI_FLOAT, MPI_SUM, world));
  const bool aware = ddp::mpi_cuda_aware();
  for (bool stage : {true, false}) {
    if (!stage && !aware) continue;  // device pointers go to MPI only where MPI is CUDA-aware
    auto mpi = ddp::cuda::make_device_mpi_communicator(world, compute, stage);
    DeviceBuffer<float> d(mine);
    mpi->allreduce_sum(d.ptr, n);
    CUDA_CHECK(cudaStreamSynchronize(compute));
    check(stage ? "MPI all-reduce staged through pinned memory" : "MPI all-reduce on device buffers",
          rel_err(d.download(), ref), 0.0);
  }
}

void test_collectives(MPI_Comm world, cudaStream_t compute, int size) {
  const std::size_t n = (std::size_t(1) << 20) + 3;
  const double tol = size == 2 ? 0.0 : 1e-6;
  std::vector<float> mine = random_vector(n, 1000 + g_rank), ref(n);
  MPI_CHECK(MPI_Allreduce(mine.data(), ref.data(), int(n), MPI_FLOAT, MPI_SUM, world));

  ddp::cuda::NcclCommunicator nccl(world, compute, {60.0});
  {
    // The trainer's path: buckets started as backward makes them (last layers
    // first), the compute stream joined at finish(); against MPI's bucketed reducer.
    const std::vector<std::pair<std::int64_t, std::int64_t>> tensors = {
        {0, 1000}, {1000, 50000}, {51000, std::int64_t(n) - 51000}};
    const std::vector<ddp::Bucket> buckets = ddp::plan_buckets(tensors, 0.1, 0.01);
    DeviceBuffer<float> d(mine);
    auto reducer = nccl.make_bucket_reducer(d.ptr, buckets, "poll", false, {});
    for (std::int64_t ready : {std::int64_t(51000), std::int64_t(1000), std::int64_t(0)})
      reducer->mark_ready(ready);
    reducer->finish();
    CUDA_CHECK(cudaStreamSynchronize(compute));
    std::vector<float> host = mine;
    ddp::GradientReducer mpi(world, host.data(), buckets, ddp::GradientReducer::Progress::Poll);
    for (std::int64_t ready : {std::int64_t(51000), std::int64_t(1000), std::int64_t(0)})
      mpi.mark_ready(ready);
    mpi.finish();
    check(("NCCL bucketed all-reduce (" + std::to_string(buckets.size()) + " buckets) vs MPI's").c_str(),
          rel_err(d.download(), host), tol);
  }
  {
    // Queued on the compute stream with no host wait in between: the events order
    // the upload, the all-reduce and the download.
    std::vector<float> got(n);
    float* d = nullptr;
    CUDA_CHECK(cudaMallocAsync(&d, n * sizeof(float), compute));
    CUDA_CHECK(cudaMemcpyAsync(d, mine.data(), n * sizeof(float), cudaMemcpyHostToDevice, compute));
    nccl.allreduce_sum(d, n);
    CUDA_CHECK(cudaMemcpyAsync(got.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, compute));
    CUDA_CHECK(cudaFreeAsync(d, compute));
    CUDA_CHECK(cudaStreamSynchronize(compute));
    check("NCCL all-reduce float vs MPI", rel_err(got, ref), tol);
  }
  {
    std::vector<double> md(mine.begin(), mine.end()), rd(n);
    MPI_CHECK(MPI_Allreduce(md.data(), rd.data(), int(n), MPI_DOUBLE, MPI_SUM, world));
    DeviceBuffer<double> d(md);
    nccl.allreduce_sum(d.ptr, n);
    nccl.synchronize();
    check("NCCL all-reduce double vs MPI", rel_err(d.download(), rd), tol);
  }
  {
    DeviceBuffer<float> d(mine);
    nccl.broadcast(d.ptr, n, size - 1);
    nccl.barrier();
    std::vector<float> root = mine;
    MPI_CHECK(MPI_Bcast(root.data(), int(n), MPI_FLOAT, size - 1, world));
    check("NCCL broadcast vs MPI", rel_err(d.download(), root), 0.0);
  }
  {
    const std::size_t per = 1000;
    std::vector<float> send = random_vector(per * size, 2000 + g_rank), sum(per * size);
    MPI_CHECK(MPI_Allreduce(send.data(), sum.data(), int(sum.size()), MPI_FLOAT, MPI_SUM, world));
    DeviceBuffer<float> dsend(send), drecv(per), dall(per * size);
    nccl.reduce_scatter_sum(dsend.ptr, drecv.ptr, per);
    nccl.all_gather(drecv.ptr, dall.ptr, per);
    nccl.synchronize();
    std::vector<float> slice(sum.begin() + g_rank * per, sum.begin() + (g_rank + 1) * per);
    check("NCCL reduce-scatter vs MPI", rel_err(drecv.download(), slice), tol);
    check("NCCL all-gather(reduce-scatter) vs MPI", rel_err(dall.download(), sum), tol);
  }
}

}  // namespace

// This rank's rank and the rank count on its node.
static void local_rank(MPI_Comm world, int* rank, int* size) {
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_rank(node, rank));
  MPI_CHECK(MPI_Comm_size(node, size));
  MPI_Comm_free(&node);
}

// cuDNN's bf16 tensor-core convolution channels-last (the GPU build's bf16 path): the
// operands moved NCHW -> NHWC (the filter KCRS -> KRSC) and cast to bf16 on the device
// by transpose_image, the results moved back and widened by it, against the double
// loop on the same bf16-rounded operands.
void test_conv_nhwc(cudaStream_t stream, ddp::cuda::CudnnConv::Search search, bool graph) {
  using ddp::cuda::DType;
  using ddp::cuda::transpose_image;
  ddp::cuda::CudnnConv conv(stream, DType::BF16, search, /*nhwc=*/true, true, graph);
  const std::string how =
      std::string(search == ddp::cuda::CudnnConv::Search::Benchmark ? " (timed search)" : "") +
      (graph ? " graph API" : "");
  ddp::cuda::ConvShape shapes[4];
  shapes[0] = {4, 16, 9, 9, 32, 3, 3, 1, 1, 1, 1, 1, 1};     // channels the tensor cores take whole
  shapes[1] = {3, 3, 12, 10, 8, 5, 3, 0, 1, 2, 2, 1, 1};     // a 3-channel stem, strided, uneven
  shapes[2] = {8, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1, 1, 1};   // a ResNet block's 3x3
  shapes[3] = {8, 64, 28, 28, 128, 1, 1, 0, 0, 2, 2, 1, 1};  // a ResNet downsample's 1x1 of stride 2
  int id = 0;
  for (const auto& s : shapes) {
    const int hw = s.h * s.w, pq = s.out_h() * s.out_w(), rs = s.r * s.s;
    std::vector<float> x = random_vector(std::size_t(s.n) * s.c * hw, 400 + id);
    std::vector<float> w = random_vector(std::size_t(s.k) * s.c * rs, 500 + id);
    std::vector<float> dy = random_vector(std::size_t(s.n) * s.k * pq, 600 + id);
    for (std::vector<float>* v : {&x, &w, &dy})
      for (float& e : *v) e = ddp::round_bf16(e);
    const ConvRef ref = conv_ref(s, x, w, dy);
    DeviceBuffer<float> x32(x), w32(w), dy32(dy), y(dy.size()), dx(x.size()), dw(w.size());
    DeviceBuffer<std::uint16_t> x16(x.size()), w16(w.size()), dy16(dy.size()), y16(dy.size()), dx16(x.size()),
        dw16(w.size());
    // fp32 NCHW -> bf16 NHWC, and back
    auto to_nhwc = [&](const float* from, std::uint16_t* to, int n, int c, int pixels) {
      transpose_image(from, DType::F32, to, DType::BF16, true, n, c, pixels, nullptr, false, false, stream);
    };
    auto from_nhwc = [&](const std::uint16_t* from, float* to, int n, int c, int pixels) {
      transpose_image(from, DType::BF16, to, DType::F32, false, n, c, pixels, nullptr, false, false, stream);
    };
    to_nhwc(x32.ptr, x16.ptr, s.n, s.c, hw);
    to_nhwc(w32.ptr, w16.ptr, s.k, s.c, rs);
    to_nhwc(dy32.ptr, dy16.ptr, s.n, s.k, pq);
    for (const DeviceBuffer<std::uint16_t>* out : {&y16, &dx16, &dw16}) poison(stream, *out);
    conv.forward(s, x16.ptr, w16.ptr, y16.ptr);
    conv.backward_data(s, w16.ptr, dy16.ptr, dx16.ptr);
    conv.backward_filter(s, x16.ptr, dy16.ptr, dw16.ptr);
    from_nhwc(y16.ptr, y.ptr, s.n, s.k, pq);
    from_nhwc(dx16.ptr, dx.ptr, s.n, s.c, hw);
    from_nhwc(dw16.ptr, dw.ptr, s.k, s.c, rs);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::string tag = " bf16 nhwc shape " + std::to_string(id) + how;
    check(("cuDNN conv forward" + tag).c_str(), rel_err(y.download(), ref.y), 1e-2);
    check(("cuDNN conv backward-data" + tag).c_str(), rel_err(dx.download(), ref.dx), 1e-2);
    check(("cuDNN conv backward-filter" + tag).c_str(), rel_err(dw.download(), ref.dw), 1e-2);
    if (graph) {
      // backward data onto what dx holds (beta = 1: a residual block's first convolution
      // in the step): dx + dx, each rounded to bf16, against 2 ref.dx
      conv.backward_data(s, w16.ptr, dy16.ptr, dx16.ptr, 1.0f, 1.0f);
      from_nhwc(dx16.ptr, dx.ptr, s.n, s.c, hw);
      CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<double> twice = ref.dx;
      for (double& v : twice) v *= 2;
      check(("cuDNN conv backward-data beta 1" + tag).c_str(), rel_err(dx.download(), twice), 1e-2);
    }
    ++id;
  }
  if (graph) check_graph_ran(conv, " bf16 nhwc" + how, 3);
}

// What the fused graphs' tests share: convolutions through the graph API, bf16
// channels-last, under the deterministic rule and under none; the device's compute
// capability (NVIDIA's samples run these fusions on 8.x and 9.x); a bottleneck's 3x3
// and last 1x1 on ResNet's 28x28 stage; and a batch norm's map for a shape's C
// channels, scale in [0.5, 1.5] and bias in [-0.5, 0.5].
struct FusedGraphs {
  ddp::cuda::CudnnConv conv, any;
  int major = 0;
  ddp::cuda::ConvShape shapes[2];
  explicit FusedGraphs(cudaStream_t stream)
      : conv(stream, ddp::cuda::DType::BF16, ddp::cuda::CudnnConv::Search::Heuristic, /*nhwc=*/true,
             /*deterministic=*/true, /*graph_api=*/true),
        any(stream, ddp::cuda::DType::BF16, ddp::cuda::CudnnConv::Search::Heuristic, /*nhwc=*/true,
            /*deterministic=*/false, /*graph_api=*/true) {
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    shapes[0] = {8, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1, 1, 1};   // a bottleneck's 3x3
    shapes[1] = {8, 64, 28, 28, 256, 1, 1, 0, 0, 1, 1, 1, 1};  // its last 1x1
  }
  // run(c, out) on the deterministic convolution, else (saying why) on `any`: the one
  // that ran; null where neither did, a failure where engines are expected (8.x, 9.x),
  // elsewhere reported alone.
  template <class Out, class Run>
  ddp::cuda::CudnnConv* first_that_runs(const Run& run, Out* out, const std::string& what) {
    ddp::cuda::CudnnConv* ran = nullptr;
    if (run(conv, out)) {
      ran = &conv;
    } else {
      std::printf("rank %d: no deterministic engine: %s %s\n", g_rank, what.c_str(),
                  conv.graph_declined_reason().c_str());
      if (run(any, out))
        ran = &any;
      else
        std::printf("rank %d: nor any engine: %s\n", g_rank, any.graph_declined_reason().c_str());
    }
    if (ran || major == 8 || major == 9)
      check(("cuDNN graph " + what + ": an engine").c_str(), ran ? 0.0 : 1.0, 0);
    else
      std::printf("rank %d: graph %s: no engine on compute capability %d (reported, not failed)\n", g_rank,
                  what.c_str(), major);
    return ran;
  }
  static void map(int C, unsigned seed, std::vector<float>* scale, std::vector<float>* bias) {
    *scale = random_vector(std::size_t(C), seed);
    *bias = random_vector(std::size_t(C), seed + 100);
    for (float& v : *scale) v = 1.0f + 0.5f * v;
    for (float& v : *bias) v *= 0.5f;
  }
  // relu(x scale + bias) of NCHW x, rounded to bf16: what the prologue's convolution reads
  static std::vector<float> rectified(const ddp::cuda::ConvShape& s, std::vector<float> x,
                                      const std::vector<float>& scale, const std::vector<float>& bias) {
    const int hw = s.h * s.w;
    for (int n = 0; n < s.n; ++n)
      for (int c = 0; c < s.c; ++c)
        for (int i = 0; i < hw; ++i) {
          float& v = x[(std::size_t(n) * s.c + c) * hw + i];
          v = ddp::round_bf16(std::max(0.0f, v * scale[c] + bias[c]));
        }
    return x;
  }
};

// The forward with batch norm's statistics in one cuDNN graph (CudnnConv::forward_stats,
// the graph API's "scale-bias-relu -> conv -> genstats"), bf16 channels-last, on
// ResNet's 3x3 and 1x1 shapes, with the prologue and without: y against the double loop
// on relu(x scale + bias) rounded to bf16 (1e-2, as the convolutions above), and the
// per-channel sums of y and y^2 against the loop's (1e-2 of the largest). y and the
// sums hold NaN before each call. Each case runs twice, the second time on new buffers
// through the plan made the first time: the same bits. Where cuDNN takes no engine for
// a graph under our rules, the reason is printed and the graph tried again with
// nondeterministic engines allowed; a graph no engine runs fails here on Ampere and
// Hopper (NVIDIA's samples run these fusions there), elsewhere it is reported alone.
void test_conv_stats(cudaStream_t stream) {
  using ddp::cuda::DType;
  using ddp::cuda::transpose_image;
  FusedGraphs f(stream);
  int id = 0;
  for (const auto& s : f.shapes)
    for (bool prologue : {false, true}) {
      const int hw = s.h * s.w, pq = s.out_h() * s.out_w(), rs = s.r * s.s;
      std::vector<float> x = random_vector(std::size_t(s.n) * s.c * hw, 1100 + id);
      std::vector<float> w = random_vector(std::size_t(s.k) * s.c * rs, 1200 + id);
      std::vector<float> scale, bias;
      FusedGraphs::map(s.c, 1300 + id, &scale, &bias);
      for (std::vector<float>* v : {&x, &w})
        for (float& e : *v) e = ddp::round_bf16(e);
      // what the convolution reads
      const std::vector<float> a = prologue ? FusedGraphs::rectified(s, x, scale, bias) : x;
      const ConvRef ref = conv_ref(s, a, w, std::vector<float>(std::size_t(s.n) * s.k * pq, 0.0f));
      std::vector<double> sum_ref(s.k, 0.0), sq_ref(s.k, 0.0);
      for (int n = 0; n < s.n; ++n)
        for (int k = 0; k < s.k; ++k)
          for (int i = 0; i < pq; ++i) {
            const double v = ref.y[(std::size_t(n) * s.k + k) * pq + i];
            sum_ref[k] += v;
            sq_ref[k] += v * v;
          }
      DeviceBuffer<float> x32(x), w32(w), dscale(scale), dbias(bias);
      DeviceBuffer<std::uint16_t> x16(x.size()), w16(w.size());
      transpose_image(x32.ptr, DType::F32, x16.ptr, DType::BF16, true, s.n, s.c, hw, nullptr, false, false,
                      stream);
      transpose_image(w32.ptr, DType::F32, w16.ptr, DType::BF16, true, s.k, s.c, rs, nullptr, false, false,
                      stream);
      const std::string tag = std::string(" bf16 nhwc shape ") + std::to_string(id / 2) +
                              (prologue ? " after scale-bias-relu" : "");
      // One run on new buffers: y (as fp32 NCHW), the sums; false where no engine ran.
      struct Out {
        std::vector<float> y, sum, sq;
      };
      auto run = [&](ddp::cuda::CudnnConv& c, Out* out) {
        DeviceBuffer<std::uint16_t> y16(ref.y.size());
        DeviceBuffer<float> y(ref.y.size()), sum(s.k), sq(s.k);
        for (const DeviceBuffer<float>* o : {&sum, &sq}) poison(stream, *o);
        poison(stream, y16);
        if (!c.forward_stats(s, x16.ptr, w16.ptr, y16.ptr, prologue ? dscale.ptr : nullptr,
                             prologue ? dbias.ptr : nullptr, sum.ptr, sq.ptr))
          return false;
        transpose_image(y16.ptr, DType::BF16, y.ptr, DType::F32, false, s.n, s.k, pq, nullptr, false, false,
                        stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        *out = {y.download(), sum.download(), sq.download()};
        return true;
      };
      Out first, again;
      ddp::cuda::CudnnConv* used = f.first_that_runs(run, &first, "conv with statistics" + tag);
      if (used) {
        check(("cuDNN graph conv with statistics: y" + tag).c_str(), rel_err(first.y, ref.y), 1e-2);
        check(("cuDNN graph conv with statistics: sum" + tag).c_str(), rel_err(first.sum, sum_ref), 1e-2);
        check(("cuDNN graph conv with statistics: sum of squares" + tag).c_str(), rel_err(first.sq, sq_ref),
              1e-2);
        const bool twice = run(*used, &again);
        // bitwise with a deterministic engine; within bf16's rounding with another
        const bool same =
            twice && (used == &f.any ? rel_err(again.y, first.y) <= 1e-2
                                     : again.y == first.y && again.sum == first.sum && again.sq == first.sq);
        check(("cuDNN graph conv with statistics: the plan again on new buffers" + tag).c_str(),
              same ? 0.0 : 1.0, 0);
      }
      ++id;
    }
}

// The weights' gradient on the input a forward_stats rectified on the way in
// (CudnnConv::backward_filter_after, the graph API's "scale-bias-relu -> wgrad"), bf16
// channels-last, on the same shapes: dw against the double loop on relu(x scale + bias)
// rounded to bf16 and dy (1e-2, as the convolutions above); dw holds NaN before each
// call; a second run on new buffers gives the same bits (a deterministic engine) or
// stays within bf16's rounding (another). Engines as test_conv_stats takes them: where
// none runs, a failure on Ampere and Hopper, a report elsewhere.
void test_conv_wgrad_after(cudaStream_t stream) {
  using ddp::cuda::DType;
  using ddp::cuda::transpose_image;
  FusedGraphs f(stream);
  int id = 0;
  for (const auto& s : f.shapes) {
    const int hw = s.h * s.w, pq = s.out_h() * s.out_w(), rs = s.r * s.s;
    std::vector<float> x = random_vector(std::size_t(s.n) * s.c * hw, 1500 + id);
    std::vector<float> dy = random_vector(std::size_t(s.n) * s.k * pq, 1600 + id);
    std::vector<float> scale, bias;
    FusedGraphs::map(s.c, 1700 + id, &scale, &bias);
    for (std::vector<float>* v : {&x, &dy})
      for (float& e : *v) e = ddp::round_bf16(e);
    const std::vector<float> a = FusedGraphs::rectified(s, x, scale, bias);  // what the gradient reads
    const ConvRef ref = conv_ref(s, a, std::vector<float>(std::size_t(s.k) * s.c * rs, 0.0f), dy);
    DeviceBuffer<float> x32(x), dy32(dy), dscale(scale), dbias(bias);
    DeviceBuffer<std::uint16_t> x16(x.size()), dy16(dy.size());
    transpose_image(x32.ptr, DType::F32, x16.ptr, DType::BF16, true, s.n, s.c, hw, nullptr, false, false,
                    stream);
    transpose_image(dy32.ptr, DType::F32, dy16.ptr, DType::BF16, true, s.n, s.k, pq, nullptr, false, false,
                    stream);
    const std::string tag = " bf16 nhwc shape " + std::to_string(id);
    // One run on new buffers: dw (as fp32 KCRS); false where no engine ran.
    auto run = [&](ddp::cuda::CudnnConv& c, std::vector<float>* out) {
      DeviceBuffer<std::uint16_t> dw16(ref.dw.size());
      DeviceBuffer<float> dw(ref.dw.size());
      poison(stream, dw16);
      if (!c.backward_filter_after(s, x16.ptr, dy16.ptr, dw16.ptr, dscale.ptr, dbias.ptr)) return false;
      transpose_image(dw16.ptr, DType::BF16, dw.ptr, DType::F32, false, s.k, s.c, rs, nullptr, false, false,
                      stream);
      CUDA_CHECK(cudaStreamSynchronize(stream));
      *out = dw.download();
      return true;
    };
    std::vector<float> first, again;
    ddp::cuda::CudnnConv* used = f.first_that_runs(run, &first, "wgrad after scale-bias-relu" + tag);
    if (used) {
      check(("cuDNN graph wgrad after scale-bias-relu: dw" + tag).c_str(), rel_err(first, ref.dw), 1e-2);
      const bool twice = run(*used, &again);
      const bool same = twice && (used == &f.any ? rel_err(again, first) <= 1e-2 : again == first);
      check(("cuDNN graph wgrad after scale-bias-relu: the plan again on new buffers" + tag).c_str(),
            same ? 0.0 : 1.0, 0);
    }
    ++id;
  }
}

// The data gradient through the batch norm's relu with its backward's sums
// (CudnnConv::backward_data_sums, the graph API's "dgrad -> drelu -> dbn" epilogue), bf16
// channels-last, on the same shapes: dx against the double loop's conv^T(dy, w) where
// x scale + bias > 0 (the mask taken in fp32 as here; 1e-2, as the convolutions above),
// the sums of it and of it times (x - mean) within 1e-2; dx and the sums hold NaN
// before each call; a second run on new buffers gives the same bits (a deterministic
// engine) or stays within bf16's rounding (another). Engines as test_conv_stats takes
// them: where none runs, a failure on Ampere and Hopper, a report elsewhere.
void test_conv_dgrad_sums(cudaStream_t stream) {
  using ddp::cuda::DType;
  using ddp::cuda::transpose_image;
  FusedGraphs f(stream);
  int id = 0;
  for (const auto& s : f.shapes) {
    const int hw = s.h * s.w, pq = s.out_h() * s.out_w(), rs = s.r * s.s;
    std::vector<float> x = random_vector(std::size_t(s.n) * s.c * hw, 1800 + id);
    std::vector<float> w = random_vector(std::size_t(s.k) * s.c * rs, 1900 + id);
    std::vector<float> dy = random_vector(std::size_t(s.n) * s.k * pq, 2000 + id);
    std::vector<float> scale, bias, mean = random_vector(std::size_t(s.c), 2100 + id);
    FusedGraphs::map(s.c, 2200 + id, &scale, &bias);
    // scale too in bf16: x scale is then exact in fp32, and x scale + bias one rounding
    // whether cuDNN's kernel fuses the multiply and add or not, so its mask is the one here
    for (std::vector<float>* v : {&x, &w, &dy, &scale})
      for (float& e : *v) e = ddp::round_bf16(e);
    const ConvRef ref = conv_ref(s, x, w, dy);
    std::vector<double> dx_ref(ref.dx.size()), sum_ref(s.c, 0.0), centred_ref(s.c, 0.0);
    for (int n = 0; n < s.n; ++n)
      for (int c = 0; c < s.c; ++c)
        for (int i = 0; i < hw; ++i) {
          const std::size_t e = (std::size_t(n) * s.c + c) * hw + i;
          const double g = x[e] * scale[c] + bias[c] > 0.0f ? ref.dx[e] : 0.0;
          dx_ref[e] = g;
          sum_ref[c] += g;
          centred_ref[c] += g * (double(x[e]) - mean[c]);
        }
    DeviceBuffer<float> x32(x), w32(w), dy32(dy), dscale(scale), dbias(bias), dmean(mean);
    DeviceBuffer<std::uint16_t> x16(x.size()), w16(w.size()), dy16(dy.size());
    transpose_image(x32.ptr, DType::F32, x16.ptr, DType::BF16, true, s.n, s.c, hw, nullptr, false, false,
                    stream);
    transpose_image(w32.ptr, DType::F32, w16.ptr, DType::BF16, true, s.k, s.c, rs, nullptr, false, false,
                    stream);
    transpose_image(dy32.ptr, DType::F32, dy16.ptr, DType::BF16, true, s.n, s.k, pq, nullptr, false, false,
                    stream);
    const std::string tag = " bf16 nhwc shape " + std::to_string(id);
    // One run on new buffers: dx (as fp32 NCHW), the sums; false where no engine ran.
    struct Out {
      std::vector<float> dx, sum, centred;
    };
    auto run = [&](ddp::cuda::CudnnConv& c, Out* out) {
      DeviceBuffer<std::uint16_t> dx16(x.size());
      DeviceBuffer<float> dx(x.size()), sum(s.c), centred(s.c);
      poison(stream, dx16);
      for (const DeviceBuffer<float>* o : {&sum, &centred}) poison(stream, *o);
      if (!c.backward_data_sums(s, w16.ptr, dy16.ptr, dx16.ptr, x16.ptr, dscale.ptr, dbias.ptr, dmean.ptr,
                                sum.ptr, centred.ptr))
        return false;
      transpose_image(dx16.ptr, DType::BF16, dx.ptr, DType::F32, false, s.n, s.c, hw, nullptr, false, false,
                      stream);
      CUDA_CHECK(cudaStreamSynchronize(stream));
      *out = {dx.download(), sum.download(), centred.download()};
      return true;
    };
    Out first, again;
    ddp::cuda::CudnnConv* used = f.first_that_runs(run, &first, "dgrad with drelu and sums" + tag);
    if (used) {
      check(("cuDNN graph dgrad with drelu and sums: dx" + tag).c_str(), rel_err(first.dx, dx_ref), 1e-2);
      check(("cuDNN graph dgrad with drelu and sums: sum" + tag).c_str(), rel_err(first.sum, sum_ref), 1e-2);
      check(("cuDNN graph dgrad with drelu and sums: centred sum" + tag).c_str(),
            rel_err(first.centred, centred_ref), 1e-2);
      const bool twice = run(*used, &again);
      const bool same =
          twice &&
          (used == &f.any ? rel_err(again.dx, first.dx) <= 1e-2 && rel_err(again.sum, first.sum) <= 1e-2 &&
                                rel_err(again.centred, first.centred) <= 1e-2
                          : again.dx == first.dx && again.sum == first.sum && again.centred == first.centred);
      check(("cuDNN graph dgrad with drelu and sums: the plan again on new buffers" + tag).c_str(),
            same ? 0.0 : 1.0, 0);
    }
    ++id;
  }
}

// n values on the device as a tensor of fp32 or bf16 elements holds them (bf16: the
// values must be bf16's already), read back as floats.
struct DeviceValues {
  DeviceBuffer<float> buf;  // n floats: room for n bf16 values too
  bool bf16;
  DeviceValues(const std::vector<float>& v, bool narrow) : buf(v.size()), bf16(narrow) {
    if (!bf16) {
      buf.upload(v);
      return;
    }
    std::vector<std::uint16_t> h(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      std::uint32_t u = 0;
      std::memcpy(&u, &v[i], sizeof u);
      h[i] = std::uint16_t(u >> 16);
    }
    CUDA_CHECK(cudaMemcpy(buf.ptr, h.data(), h.size() * sizeof(std::uint16_t), cudaMemcpyHostToDevice));
  }
  std::vector<float> get() const {
    if (!bf16) return buf.download();
    std::vector<std::uint16_t> h(buf.n);
    CUDA_CHECK(cudaMemcpy(h.data(), buf.ptr, h.size() * sizeof(std::uint16_t), cudaMemcpyDeviceToHost));
    std::vector<float> v(buf.n);
    for (std::size_t i = 0; i < v.size(); ++i) {
      const std::uint32_t u = std::uint32_t(h[i]) << 16;
      std::memcpy(&v[i], &u, sizeof u);
    }
    return v;
  }
};

// ConvKernels::backward_data adding to dx (a residual block's first convolution onto
// the shortcut's gradient, a projection's onto the branch's): cuDNN blends with
// beta = 1 where it writes dx as it is (fp32 NCHW; bf16 NHWC, the narrow path), the
// epilogue adds where it widens into an fp32 dx. Each against the gradient written
// alone plus what dx held: fp32 to its rounding, bf16 to 2^-7 (the sum rounded once
// to bf16 against the gradient rounded and then the sum).
void test_conv_accumulate(cudaStream_t stream) {
  using ddp::Layout;
  using ddp::Precision;
  auto backend = ddp::cuda::make_cuda_backend(stream);
  ddp::ConvGeometry g;
  g.in = 16, g.h = g.w = 9, g.out = 32, g.k = 3, g.stride = 1, g.pad = 1, g.bias = false;
  const int B = 4;
  const std::size_t nx = std::size_t(B) * g.in * g.h * g.w, ny = std::size_t(B) * g.out * g.ho() * g.wo(),
                    nw = std::size_t(g.out) * g.in * g.k * g.k;
  struct Case {
    const char* name;
    Precision precision;
    ddp::ConvSide side;
  };
  const Case cases[] = {{"fp32, fp32 NCHW sides", Precision::fp32, {Layout::nchw, Precision::fp32}},
                        {"bf16, bf16 NHWC sides", Precision::bf16, {Layout::nhwc, Precision::bf16}},
                        {"bf16, fp32 NCHW sides", Precision::bf16, {Layout::nchw, Precision::fp32}}};
  for (const Case& c : cases) {
    const std::string tag = std::string("conv backward-data += ") + c.name;
    auto conv = backend->make_conv(g);
    conv->configure(c.precision, /*fused_relu=*/false, c.side, c.side);
    if (!conv->accumulates_input_grad()) {
      check((tag + ": adds (accumulates_input_grad)").c_str(), 1.0, 0.0);
      continue;
    }
    const bool narrow = c.side.type != Precision::fp32;
    std::vector<float> dy = random_vector(ny, 700), prior = random_vector(nx, 701);
    if (narrow)
      for (std::vector<float>* v : {&dy, &prior})
        for (float& e : *v) e = ddp::round_bf16(e);
    DeviceValues dyv(dy, narrow), alone(std::vector<float>(nx, 0.0f), narrow), sum(prior, narrow);
    DeviceBuffer<float> w(random_vector(nw, 702));
    conv->backward_data(B, dyv.buf.ptr, w.ptr, alone.buf.ptr, /*accumulate=*/false);
    conv->backward_data(B, dyv.buf.ptr, w.ptr, sum.buf.ptr, /*accumulate=*/true);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<float> a = alone.get();
    std::vector<double> want(nx);
    for (std::size_t i = 0; i < nx; ++i) want[i] = double(a[i]) + prior[i];
    check(tag.c_str(), rel_err(sum.get(), want), narrow ? 1e-2 : 1e-6);
  }
}

// transpose_image alone: fp32 NCHW -> NHWC -> NCHW is the identity; back with bias,
// relu and add, the loop's values.
void test_transpose_image(cudaStream_t stream) {
  using ddp::cuda::DType;
  using ddp::cuda::transpose_image;
  const int N = 3, C = 5, HW = 7;
  const std::vector<float> a = random_vector(std::size_t(N) * C * HW, 700), bias = random_vector(C, 701),
                           acc = random_vector(a.size(), 702);
  DeviceBuffer<float> da(a), nhwc(a.size()), back(a.size()), dbias(bias), out(acc);
  transpose_image(da.ptr, DType::F32, nhwc.ptr, DType::F32, true, N, C, HW, nullptr, false, false, stream);
  transpose_image(nhwc.ptr, DType::F32, back.ptr, DType::F32, false, N, C, HW, nullptr, false, false, stream);
  transpose_image(nhwc.ptr, DType::F32, out.ptr, DType::F32, false, N, C, HW, dbias.ptr, true, true, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<float> got_nhwc = nhwc.download();
  std::vector<double> want_nhwc(a.size()), want_out(a.size());
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c)
      for (int i = 0; i < HW; ++i) {
        const std::size_t e = (std::size_t(n) * C + c) * HW + i;
        want_nhwc[(std::size_t(n) * HW + i) * C + c] = a[e];
        want_out[e] = double(acc[e]) + std::max(0.0f, a[e] + bias[c]);
      }
  check("NCHW -> NHWC fp32", rel_err(got_nhwc, want_nhwc), 0.0);
  check("NCHW -> NHWC -> NCHW fp32", rel_err(back.download(), a), 0.0);
  check("NHWC -> NCHW + bias, relu, add", rel_err(out.download(), want_out), 1e-6);
}

// train.cuda_graph's capture through the backend (ComputeBackend::capture): a GEMM,
// a convolution's forward (its bias and relu epilogue), backward-filter and
// backward-data, captured once after a warm-up call (as a step's first sight runs
// uncaptured) and replayed on new contents of the same buffers: bitwise what the
// same calls give uncaptured. bf16 adds the operand casts (and, by default, the NHWC
// moves).
void test_graph_capture(cudaStream_t stream, ddp::Precision precision) {
  using ddp::Layout;
  auto backend = ddp::cuda::make_cuda_backend(stream);
  const int m = 64, n = 48, k = 80, B = 4;
  ddp::ConvGeometry g;
  g.in = 3, g.h = g.w = 16, g.out = 8, g.k = 3, g.stride = 1, g.pad = 1, g.bias = true;
  auto conv = backend->make_conv(g);
  conv->configure(precision, /*fused_relu=*/true, {Layout::nchw}, {Layout::nchw});
  const std::size_t nx = std::size_t(B) * g.in * g.h * g.w, ny = std::size_t(B) * g.out * g.ho() * g.wo(),
                    nw = std::size_t(g.out) * g.in * g.k * g.k;
  DeviceBuffer<float> a(std::size_t(m) * k), b(std::size_t(k) * n), c(std::size_t(m) * n), x(nx), w(nw),
      bias(std::size_t(g.out)), y(ny), dy(ny), dw(nw), db(std::size_t(g.out)), dx(nx);
  const auto fill = [&](unsigned seed) {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (DeviceBuffer<float>* buf : {&a, &b, &x, &w, &bias, &dy}) buf->upload(random_vector(buf->n, seed++));
  };
  const auto work = [&] {
    backend->gemm(false, false, m, n, k, 1.0f, a.ptr, k, b.ptr, n, 0.0f, c.ptr, n, precision);
    conv->forward(B, x.ptr, w.ptr, bias.ptr, y.ptr);
    conv->backward_weights(B, x.ptr, dy.ptr, dw.ptr, db.ptr, /*accumulate=*/false);
    conv->backward_data(B, dy.ptr, w.ptr, dx.ptr, /*accumulate=*/false);
  };
  const auto outputs = [&] {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<std::vector<float>> out;
    for (const DeviceBuffer<float>* buf : {&c, &y, &dw, &db, &dx}) out.push_back(buf->download());
    return out;
  };
  fill(900);
  work();  // plans and workspaces
  auto graph = backend->capture(work);
  const std::string tag = std::string(" ") + ddp::precision_name(precision);
  for (unsigned round = 0; round < 2; ++round) {
    fill(910 + 10 * round);
    work();
    const auto want = outputs();
    fill(910 + 10 * round);
    graph->replay();
    const auto got = outputs();
    const char* names[] = {"GEMM", "conv forward", "conv backward-filter", "conv bias gradient",
                           "conv backward-data"};
    for (std::size_t i = 0; i < got.size(); ++i)
      check(("CUDA graph replay == uncaptured: " + std::string(names[i]) + tag).c_str(),
            rel_err(got[i], want[i]), 0.0);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm world = MPI_COMM_WORLD;
  int size = 1;
  MPI_Comm_rank(world, &g_rank);
  MPI_Comm_size(world, &size);
  // DDP_SELFTEST_ONLY=collectives: MPI's and NCCL's checks alone (gpu_nccl_selftest_np2:
  // ranks time-sliced on one GPU, where the single-rank checks cost minutes and say
  // nothing of the collectives). Any other value ends every rank, whichever saw it.
  const char* only = std::getenv("DDP_SELFTEST_ONLY");
  const bool collectives_only = only && std::string(only) == "collectives";
  if (only && !collectives_only) {
    std::fprintf(stderr, "rank %d: DDP_SELFTEST_ONLY='%s': expected 'collectives' or unset\n", g_rank, only);
    MPI_Abort(world, 2);
  }

  int local = 0, local_size = 1;
  local_rank(world, &local, &local_size);
  ddp::DeviceChoice dev = ddp::cuda::bind_device(local);
  int have = dev.device >= 0 ? 1 : 0, all_have = 0;
  MPI_CHECK(MPI_Allreduce(&have, &all_have, 1, MPI_INT, MPI_MIN, world));
  if (!all_have) {
    if (g_rank == 0) std::printf("skipped: %s\n", dev.reason.c_str());  // "no CUDA device (why)"
    MPI_Finalize();
    return DDP_GPU_SKIP_CODE;
  }
  std::printf("rank %d: %s\n", g_rank, dev.reason.c_str());

  cudaStream_t compute;
  CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  if (!collectives_only) {
    test_gemm(compute);
    for (bool graph : {false, true}) {
      test_conv(compute, ddp::cuda::CudnnConv::Search::Heuristic, graph);
      test_conv(compute, ddp::cuda::CudnnConv::Search::Benchmark, graph);
      test_conv_nhwc(compute, ddp::cuda::CudnnConv::Search::Heuristic, graph);
      test_conv_nhwc(compute, ddp::cuda::CudnnConv::Search::Benchmark, graph);
    }
    test_conv_stats(compute);
    test_conv_wgrad_after(compute);
    test_conv_dgrad_sums(compute);
    test_conv_accumulate(compute);
    test_transpose_image(compute);
    test_graph_capture(compute, ddp::Precision::fp32);
    test_graph_capture(compute, ddp::Precision::bf16);
  }
  test_device_mpi(world, compute);
  // NCCL runs one rank per GPU: where ranks hold the same one, its checks cannot run.
  // Decided as ddp_train decides it (gpus_shared_on_nodes: the GPU's bus id and NCCL's
  // host), not by counts: under --gpus-per-task each rank sees one GPU of its own, and
  // under tools/nccl_one_gpu each rank is a host of its own to NCCL.
  ddp::HeldGpu mine;
  mine.bus_id = ddp::cuda::current_bus_id();
  if (const char* host = std::getenv("NCCL_HOSTID")) mine.nccl_host = host;
  const std::string shared = ddp::gpus_shared_on_nodes(world, mine);
  const bool any_shared = !shared.empty();
  if (!any_shared) test_collectives(world, compute, size);
  CUDA_CHECK(cudaStreamDestroy(compute));

  int failures = 0;
  MPI_CHECK(MPI_Allreduce(&g_failures, &failures, 1, MPI_INT, MPI_SUM, world));
  if (g_rank == 0) std::printf("%s: %d check(s) failed\n", failures ? "FAILED" : "passed", failures);
  if (!failures && any_shared) {
    if (g_rank == 0)
      std::printf("skipped: the NCCL checks need a GPU of its own for each rank, and %s\n", shared.c_str());
    MPI_Finalize();
    return DDP_GPU_SKIP_CODE;
  }
  MPI_Finalize();
  return failures ? 1 : 0;
}
