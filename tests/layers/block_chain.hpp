#pragma once
// Residual blocks in a row, for the layer tests: at precision p, first to last, on
// the same x, dy and parameters every time, y, dx and the parameter gradients after
// two steps, and the model's own kernels that ran (by label). Narrow: keeping their
// activations inside narrow and handing them on so (the model's plan on a GPU with
// narrow convolutions); else everything fp32 between the layers. Their batch norms
// on `library`'s kernels where it is not null and they can (BatchNorm2d::
// set_library_kernels), else on the model's own.

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "layer_fixture.hpp"
#include "model/kernel_trace.hpp"
#include "model/resblock.hpp"

namespace ddp::test {

struct ChainResults {
  std::vector<float> y, dx, grads;
  std::map<std::string, std::int64_t> kernels;
};

inline ChainResults run_blocks(Precision p, bool narrow, const std::vector<std::string>& specs,
                               const Shape& sample, BatchNormKernels* library = nullptr) {
  const std::int64_t B = 4, n = std::int64_t(specs.size());
  std::vector<std::unique_ptr<BoundLayer>> blocks;
  Shape in = sample;
  for (std::int64_t i = 0; i < n; ++i) {
    blocks.push_back(std::make_unique<BoundLayer>(specs[i], in));
    in = blocks.back()->out_sample;
    auto& block = dynamic_cast<ResBlock&>(*blocks.back()->layer);
    block.set_precision(p);
    block.fuse_passes();
    block.set_library_batch_norm(library);
    block.set_layouts(Layout::nchw, block.native_layout(), Layout::nchw);
    if (narrow) block.set_types(i > 0 ? p : Precision::fp32, p, i + 1 < n ? p : Precision::fp32);
  }
  Tensor x, dy;
  resize(x, B, sample, "test::x");
  resize(dy, B, in, "test::dy");
  from_host(x.data, random_values(x.numel(), 31));
  from_host(dy.data, random_values(dy.numel(), 32));
  std::vector<Tensor> acts(n), grads(n);
  kernel_trace::start_counting();
  for (int step = 0; step < 2; ++step) {  // the second on buffers already there
    for (std::int64_t i = 0; i < n; ++i) blocks[i]->layer->forward(i ? acts[i - 1] : x, acts[i], true);
    for (std::int64_t i = n; i-- > 0;)
      blocks[i]->layer->backward(i ? acts[i - 1] : x, acts[i], i + 1 < n ? grads[i + 1] : dy, grads[i]);
  }
  ChainResults r;
  r.kernels = kernel_trace::stop_counting().kernels;
  for (std::int64_t i = 0; i + 1 < n; ++i) {  // handed on narrow, forward and backward
    EXPECT_EQ(acts[i].type, narrow ? p : Precision::fp32);
    EXPECT_EQ(grads[i + 1].type, narrow ? p : Precision::fp32);
  }
  EXPECT_EQ(acts.back().type, Precision::fp32);
  EXPECT_EQ(grads.front().type, Precision::fp32);
  r.y = to_host(acts.back().data, acts.back().numel());
  r.dx = to_host(grads.front().data, grads.front().numel());
  for (const auto& block : blocks) {
    const std::vector<float> g = to_host(block->grads, block->n);
    r.grads.insert(r.grads.end(), g.begin(), g.end());
  }
  return r;
}

}  // namespace ddp::test
