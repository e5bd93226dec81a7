#pragma once
// The heavy kernels of a step (GEMMs, convolutions), recorded so that a benchmark
// can time them alone at the very shapes the model used: the floor a step's time
// is measured against. Recording is off unless a benchmark turns it on; then each
// GEMM and convolution registers a replay of itself. A replay reuses the buffers
// of the recorded call, so it is only for a model that is no longer training.

#include <functional>
#include <string>
#include <vector>

namespace ddp::kernel_trace {

struct Kernel {
  std::string name;              // e.g. "gemm 64x256x784", "conv2d fwd"
  double flops = 0.0;            // floating-point operations of one call
  std::function<void()> replay;  // runs the same call again
};

void start();
bool recording();
void record(Kernel kernel);
std::vector<Kernel> stop();

}  // namespace ddp::kernel_trace
