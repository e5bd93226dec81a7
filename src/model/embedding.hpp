#pragma once
// Token and position embeddings, the first layers of a language model (GPT-2's wte
// and wpe) and of a vision transformer's positions.
//
// embedding(vocab, d): PyTorch's nn.Embedding(vocab, d). A (T) sample of token ids
// (token shards: data.seq_len = T, the ids as exact floats) -> (T, d), row t the
// table's row of token t. Parameter weight (vocab, d), nn.Embedding's layout and
// initialisation N(0, 1), or N(0, std^2) (std=0.02: GPT-2's and nanoGPT's). An id
// outside [0, vocab) never reaches the kernel: the shards are checked against the
// vocabulary at start-up (ShardDataset::check_labels). A tied head (linear(n, tied))
// shares the table; the model has this layer add its part of the table's gradient
// after the head's (Model::find_ties).
// Backward: weight's gradient is the sum of dy over the rows of each id, a thread per
// feature walking the rows in order (the same bits every run, on any device); with
// overwrite_gradients() on, the whole table's gradient is written (zeros for ids the
// batch does not hold), as PyTorch's dense gradient. No input gradient (ids have none).
//
// pos_embedding(T): learned positions, y = x + P[t] for a (T', d) sample with T' <= T
// (the positions the model has; a longer sequence is one line at start-up). Parameter
// weight (T, d), the layout of nn.Embedding(T, d) (GPT-2's wpe) and its initialisation
// N(0, 1), or N(0, std^2) (0.02: GPT-2's; ViT's encoder.pos_embedding, whose (1, T, d)
// holds the same numbers). dx = dy; weight's gradient sums dy over the batch, in batch order, a thread
// per (position, feature). Rows T'..T-1 get no gradient (zero when overwritten).

#include "model/layer.hpp"

namespace ddp {

class Embedding : public Layer {
 public:
  Embedding(std::int64_t vocab, std::int64_t d, float stddev = 1.0f)
      : vocab_(vocab), d_(d), stddev_(stddev) {}

  std::string kind() const override { return "embedding"; }
  std::int64_t vocab() const { return vocab_; }
  std::int64_t features() const { return d_; }
  Shape output_shape(const Shape& in_sample) override;
  std::vector<ParamSpec> parameter_specs() const override;
  void bind(float* params, float* grads) override;
  void init(Rng& rng) override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;

 private:
  std::int64_t vocab_, d_, T_ = 0;
  float stddev_;              // of the initial N(0, stddev^2)
  Shape sample_;              // (T, d): its output
  float* weight_ = nullptr;   // (vocab, d)
  float* dweight_ = nullptr;  // (vocab, d)
};

class PosEmbedding : public Layer {
 public:
  explicit PosEmbedding(std::int64_t positions, float stddev = 1.0f)
      : positions_(positions), stddev_(stddev) {}

  std::string kind() const override { return "pos_embedding"; }
  Shape output_shape(const Shape& in_sample) override;
  std::vector<ParamSpec> parameter_specs() const override;
  void bind(float* params, float* grads) override;
  void init(Rng& rng) override;
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;

 private:
  std::int64_t positions_, T_ = 0, d_ = 0;
  float stddev_;              // of the initial N(0, stddev^2)
  Shape sample_;              // (T', d)
  float* weight_ = nullptr;   // (positions, d)
  float* dweight_ = nullptr;  // (positions, d)
};

}  // namespace ddp
