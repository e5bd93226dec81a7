// ResNet-50's convolutions one shape at a time (torchvision's resnet50 at 224x224: 53
// convolutions, 23 shapes) at batch B, bf16 channels-last on the GPU, each direction
// (forward, backward data, backward filter) timed alone on the device (CUDA events on
// the stream; the median of R rounds after 2 warm-up calls), through cuDNN's legacy API
// (cudnnConvolution*, the _v7 heuristics' choices) and through its graph API
// (DDP_CUDNN_GRAPH's path, cuda/conv_graph.cpp), the algorithms chosen as a training
// run chooses them (DDP_CUDNN_BENCHMARK=1 in the environment: each API's timed search).
// Then each side's time summed over the step's 53 convolutions (the stem's backward
// data left out: the image needs no gradient). tools/torch_conv_bench.py times
// PyTorch's on the same shapes and puts this table beside its own (#62: "our
// convolutions cost what PyTorch's cost at the same shapes"). A program, not a test;
// in the CUDA build only:
//   build/cudnn_conv_bench [batch 256] [rounds 10]
// Prints one line per shape, "conv_bench: " then the shape, its count in the step and
// the six times in ms, and a total line.
#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/conv.hpp"
#include "cuda/cuda_check.hpp"

namespace {

using ddp::cuda::ConvShape;
using ddp::cuda::CudnnConv;
using ddp::cuda::DType;

struct Case {
  ConvShape s;
  int count;  // in ResNet-50's step
};

// torchvision's resnet50 (v1.5: the stride on the 3x3) at 224x224, batch n: each
// distinct convolution shape and how many of the 53 convolutions have it.
std::vector<Case> resnet50_shapes(int n) {
  auto conv = [n](int c, int hw, int k, int r, int stride, int count) {
    ConvShape s;
    s.n = n, s.c = c, s.h = s.w = hw, s.k = k, s.r = s.s = r;
    s.pad_h = s.pad_w = r / 2;
    s.stride_h = s.stride_w = stride;
    return Case{s, count};
  };
  return {
      conv(3, 224, 64, 7, 2, 1),                                                                  // stem
      conv(64, 56, 64, 1, 1, 1),     conv(64, 56, 64, 3, 1, 3),    conv(64, 56, 256, 1, 1, 4),    // layer1
      conv(256, 56, 64, 1, 1, 2),                                                                 // layer1
      conv(256, 56, 128, 1, 1, 1),   conv(128, 56, 128, 3, 2, 1),  conv(128, 28, 512, 1, 1, 4),   // layer2
      conv(256, 56, 512, 1, 2, 1),   conv(512, 28, 128, 1, 1, 3),  conv(128, 28, 128, 3, 1, 3),   // layer2
      conv(512, 28, 256, 1, 1, 1),   conv(256, 28, 256, 3, 2, 1),  conv(256, 14, 1024, 1, 1, 6),  // layer3
      conv(512, 28, 1024, 1, 2, 1),  conv(1024, 14, 256, 1, 1, 5), conv(256, 14, 256, 3, 1, 5),   // layer3
      conv(1024, 14, 512, 1, 1, 1),  conv(512, 14, 512, 3, 2, 1),  conv(512, 7, 2048, 1, 1, 3),   // layer4
      conv(1024, 14, 2048, 1, 2, 1), conv(2048, 7, 512, 1, 1, 2),  conv(512, 7, 512, 3, 1, 2),    // layer4
  };
}

// A device buffer of bf16 values, every one 0x3C3C (about 0.0115): the times do not
// depend on the values, and no sum overflows.
struct Buffer {
  void* p = nullptr;
  explicit Buffer(std::size_t elements) {
    CUDA_CHECK(cudaMalloc(&p, elements * 2));
    CUDA_CHECK(cudaMemset(p, 0x3C, elements * 2));
  }
  ~Buffer() { cudaFree(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

// The median over `rounds` of one call's time on the stream, in ms, after 2 warm-up
// calls (the first makes the plan).
template <class F>
double median_ms(cudaStream_t stream, int rounds, F call) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  call();
  call();
  std::vector<float> ms(std::size_t(rounds), 0.0f);
  for (float& t : ms) {
    CUDA_CHECK(cudaEventRecord(start, stream));
    call();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
  }
  CUDA_CHECK(cudaEventDestroy(stop));
  CUDA_CHECK(cudaEventDestroy(start));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);  // the check family ends a failure with MPI_Abort
  const int batch = argc > 1 ? std::atoi(argv[1]) : 256;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 10;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cudnn_conv_bench: no CUDA device\n");
    MPI_Finalize();
    return 2;
  }
  CUDA_CHECK(cudaSetDevice(0));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const char* b = std::getenv("DDP_CUDNN_BENCHMARK");
  const bool timed = b && *b && std::string(b) != "0";
  const CudnnConv::Search search = timed ? CudnnConv::Search::Benchmark : CudnnConv::Search::Heuristic;
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    CudnnConv legacy(stream, DType::BF16, search, /*nhwc=*/true, /*deterministic=*/true, /*graph_api=*/false);
    CudnnConv graph(stream, DType::BF16, search, /*nhwc=*/true, /*deterministic=*/true, /*graph_api=*/true);
    std::printf(
        "cudnn_conv_bench: ResNet-50's convolutions, batch %d, bf16 channels-last, %s, %s; the median "
        "of %d rounds, ms\n",
        batch, prop.name, timed ? "each API's timed search" : "each API's heuristics", rounds);
    std::printf("%-34s %5s | %8s %8s %8s | %8s %8s %8s | graph API\n", "shape (N C HxW K RxS/stride)",
                "count", "fwd", "data", "filter", "fwd", "data", "filter");
    std::printf("%-34s %5s | %26s | %26s |\n", "", "", "legacy API", "graph API");
    double total[2] = {0, 0};
    for (const Case& c : resnet50_shapes(batch)) {
      const ConvShape& s = c.s;
      // inputs never written (the times' values stay put): dx and dw apart from x and w
      const std::size_t nx = std::size_t(s.n) * s.c * s.h * s.w, nw = std::size_t(s.k) * s.c * s.r * s.s;
      Buffer x(nx), w(nw), y(std::size_t(s.n) * s.k * s.out_h() * s.out_w()), dx(nx), dw(nw);
      double t[2][3];
      CudnnConv* apis[2] = {&legacy, &graph};
      for (int a = 0; a < 2; ++a) {
        CudnnConv& conv = *apis[a];
        t[a][0] = median_ms(stream, rounds, [&] { conv.forward(s, x.p, w.p, y.p); });
        t[a][1] = median_ms(stream, rounds, [&] { conv.backward_data(s, w.p, y.p, dx.p); });
        t[a][2] = median_ms(stream, rounds, [&] { conv.backward_filter(s, x.p, y.p, dw.p); });
        // the stem's backward data is not in the step (the image needs no gradient)
        total[a] += c.count * (t[a][0] + (s.c == 3 ? 0.0 : t[a][1]) + t[a][2]);
      }
      char shape[64];
      std::snprintf(shape, sizeof shape, "N%d C%d %dx%d K%d %dx%d/%d", s.n, s.c, s.h, s.w, s.k, s.r, s.s,
                    s.stride_h);
      std::printf("conv_bench: %-22s %5d | %8.3f %8.3f %8.3f | %8.3f %8.3f %8.3f |\n", shape, c.count,
                  t[0][0], t[0][1], t[0][2], t[1][0], t[1][1], t[1][2]);
    }
    std::printf(
        "conv_bench total (the step's 53 convolutions, the stem's backward data left out): legacy API "
        "%.2f ms, graph API %.2f ms (graph / legacy %.3f); graph API plans %zu, left to the legacy API "
        "%zu\n",
        total[0], total[1], total[1] / total[0], graph.graph_plans(), graph.graph_declined());
    if (graph.graph_declined())
      std::printf("  the last declined: %s\n", graph.graph_declined_reason().c_str());
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
  MPI_Finalize();
  return 0;
}
