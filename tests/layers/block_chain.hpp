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

#include "../model/allocations.hpp"
#include "layer_fixture.hpp"
#include "model/kernel_trace.hpp"
#include "model/resblock.hpp"

namespace ddp::test {

struct ChainResults {
  std::vector<float> y, dx, grads, buffers;  // buffers: the running statistics, block by block
  std::map<std::string, std::int64_t> kernels;
};

// Such a chain at batch 4, its blocks fused and laid out as the model would, their
// types set where narrow; x and dy the same every time; step(): a training forward
// and backward, each block's output and input gradient in acts and grads.
struct BlockChain {
  std::vector<std::unique_ptr<BoundLayer>> blocks;
  Tensor x, dy;
  std::vector<Tensor> acts, grads;

  BlockChain(Precision p, bool narrow, const std::vector<std::string>& specs, const Shape& sample,
             BatchNormKernels* library) {
    const std::size_t n = specs.size();
    Shape in = sample;
    for (std::size_t i = 0; i < n; ++i) {
      blocks.push_back(std::make_unique<BoundLayer>(specs[i], in));
      in = blocks.back()->out_sample;
      auto& block = dynamic_cast<ResBlock&>(*blocks.back()->layer);
      block.set_precision(p);
      block.fuse_passes();
      block.set_library_batch_norm(library);
      block.set_layouts(Layout::nchw, block.native_layout(), Layout::nchw);
      if (narrow) block.set_types(i > 0 ? p : Precision::fp32, p, i + 1 < n ? p : Precision::fp32);
    }
    resize(x, kBatch, sample, "test::x");
    resize(dy, kBatch, in, "test::dy");
    from_host(x.data, random_values(x.numel(), 31));
    from_host(dy.data, random_values(dy.numel(), 32));
    acts.resize(n);
    grads.resize(n);
  }
  void step() {
    const std::size_t n = blocks.size();
    for (std::size_t i = 0; i < n; ++i) blocks[i]->layer->forward(i ? acts[i - 1] : x, acts[i], true);
    for (std::size_t i = n; i-- > 0;)
      blocks[i]->layer->backward(i ? acts[i - 1] : x, acts[i], i + 1 < n ? grads[i + 1] : dy, grads[i]);
  }
  static constexpr std::int64_t kBatch = 4;
};

// The memory plan's check of a chain: the floats its blocks plan (kept_floats) and
// those they allocate in one step beside the outputs and input gradients between them
// (the model's), in `blocks` allocations; a RecordAllocations must be living.
struct ChainMemory {
  std::int64_t planned = 0, allocated = 0, blocks = 0;
};
inline ChainMemory step_memory(BlockChain& chain) {
  ChainMemory m;
  for (const auto& block : chain.blocks) m.planned += block->layer->kept_floats(BlockChain::kBatch);
  const LiveBlocks before = live_blocks();
  chain.step();
  Kokkos::fence();
  m.allocated = allocated_since(before, &m.blocks);
  for (std::size_t i = 0; i < chain.blocks.size(); ++i)
    m.allocated -= chain.acts[i].storage_floats() + chain.grads[i].storage_floats();
  return m;
}

inline ChainResults run_blocks(Precision p, bool narrow, const std::vector<std::string>& specs,
                               const Shape& sample, BatchNormKernels* library = nullptr) {
  BlockChain chain(p, narrow, specs, sample, library);
  const std::int64_t n = std::int64_t(specs.size());
  const std::vector<Tensor>&acts = chain.acts, &grads = chain.grads;
  const auto& blocks = chain.blocks;
  kernel_trace::start_counting();
  chain.step();
  chain.step();  // the second on buffers already there
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
    const std::vector<float> g = to_host(block->grads, block->n), b = to_host(block->buffers, block->nbuf);
    r.grads.insert(r.grads.end(), g.begin(), g.end());
    r.buffers.insert(r.buffers.end(), b.begin(), b.end());
  }
  return r;
}

}  // namespace ddp::test
