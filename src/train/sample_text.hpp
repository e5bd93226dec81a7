#pragma once
// io.sample_tokens: a language model is judged by reading what it writes. At each
// validation the model continues a prompt, the first half of the validation set's
// first window, by n tokens: each drawn from softmax(logits / temperature) at the last
// position of the window of the T most recent tokens (temperature 0: the most likely
// token), by a random stream keyed on train.seed and the epoch, so the same weights
// write the same text on any number of ranks. Positions past the text hold token 0,
// which a causal model's logits at the text's last position never see (a model that
// is not causal reads them, and its sample means little). Every rank computes it (the
// same forwards, so no rank waits in the next collective); rank 0 decodes and prints.

#include <cstdint>
#include <string>
#include <vector>

#include "io/shard_dataset.hpp"
#include "model/model.hpp"

namespace ddp {

struct TextSample {
  std::vector<std::int32_t> prompt;        // the window's first T / 2 tokens
  std::vector<std::int32_t> continuation;  // the n the model wrote
};

// model: input (T) token ids, output (T, V) logits; val: token shards of windows of T.
// x: the model's (1, T) input, kept by the caller from one call to the next: the model
// holds on to its last input, and a buffer freed later, inside a captured step, would
// end that capture.
TextSample sample_tokens(Model& model, ShardDataset& val, std::int64_t n, double temperature,
                         std::uint64_t seed, Tensor& x);

// ids as text through `vocab` (id to bytes; an id outside it, or an empty vocab: "<id>").
std::string decode(const std::vector<std::int32_t>& ids, const std::vector<std::string>& vocab);
// For one log line: newlines, tabs and other control bytes as \n, \t, \xNN; the rest as is.
std::string escaped(const std::string& text);

}  // namespace ddp
