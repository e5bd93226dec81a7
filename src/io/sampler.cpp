#include "io/sampler.hpp"

#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#include "comm/check.hpp"

namespace ddp {

namespace {

// Uniform in [0, bound) without modulo bias: draws below 2^64 mod bound are
// rejected, so every residue has the same number of preimages.
std::uint64_t bounded(std::mt19937_64& gen, std::uint64_t bound) {
  const std::uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  for (;;) {
    const std::uint64_t r = gen();
    if (r >= threshold) return r % bound;
  }
}

void check_replicas(int num_replicas, int rank) {
  if (num_replicas < 1 || rank < 0 || rank >= num_replicas)
    throw InputError("sampler: rank " + std::to_string(rank) + " is outside [0, " +
                     std::to_string(num_replicas) + ")");
}

}  // namespace

std::vector<std::int64_t> seeded_permutation(std::int64_t n, std::uint64_t seed) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), std::int64_t{0});
  std::mt19937_64 gen(seed);  // the standard fixes mt19937_64's output sequence
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(bounded(gen, static_cast<std::uint64_t>(i) + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

DistributedSampler::DistributedSampler(std::int64_t dataset_size, int num_replicas, int rank, bool shuffle,
                                       std::uint64_t seed, bool drop_last)
    : size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  check_replicas(num_replicas, rank);
  if (dataset_size < 0) throw InputError("sampler: negative data set size");
  // torch: ceil(N/W) with padding, floor(N/W) with drop_last.
  num_samples_ = drop_last ? size_ / num_replicas_ : (size_ + num_replicas_ - 1) / num_replicas_;
}

std::vector<std::int64_t> DistributedSampler::global_order() const {
  std::vector<std::int64_t> order;
  if (shuffle_) {
    // torch seeds with seed + epoch; unsigned wrap-around keeps it defined.
    order = seeded_permutation(size_, seed_ + static_cast<std::uint64_t>(epoch_));
  } else {
    order.resize(static_cast<std::size_t>(size_));
    std::iota(order.begin(), order.end(), std::int64_t{0});
  }
  const auto total = static_cast<std::size_t>(total_size());
  if (order.size() >= total) {
    order.resize(total);  // drop_last: the tail is dropped
  } else {
    // Pad by cycling from the start (padding may exceed N when N < W).
    const std::size_t n = order.size();
    for (std::size_t i = 0; order.size() < total; ++i) order.push_back(order[i % n]);
  }
  return order;
}

std::vector<std::int64_t> DistributedSampler::indices() const {
  const auto order = global_order();
  std::vector<std::int64_t> mine;
  mine.reserve(static_cast<std::size_t>(num_samples_));
  for (std::size_t i = static_cast<std::size_t>(rank_); i < order.size(); i += num_replicas_)
    mine.push_back(order[i]);
  return mine;
}

std::vector<std::int64_t> shard_indices(std::int64_t n, int num_replicas, int rank) {
  check_replicas(num_replicas, rank);
  std::vector<std::int64_t> mine;
  for (std::int64_t i = rank; i < n; i += num_replicas) mine.push_back(i);
  return mine;
}

std::vector<std::int64_t> epoch_indices(std::int64_t dataset_size, int world, int rank, bool shuffle,
                                        std::uint64_t seed, bool drop_last, std::int64_t epoch,
                                        std::int64_t consumed) {
  DistributedSampler sampler(dataset_size, world, rank, shuffle, seed, drop_last);
  sampler.set_epoch(epoch);
  if (consumed <= 0) return sampler.indices();
  std::vector<std::int64_t> order;  // P: the unpadded order
  if (shuffle) {
    order = seeded_permutation(dataset_size, seed + std::uint64_t(epoch));
  } else {
    order.resize(std::size_t(dataset_size));
    std::iota(order.begin(), order.end(), std::int64_t{0});
  }
  std::vector<std::int64_t> rest(order.begin() + std::min<std::int64_t>(consumed, dataset_size), order.end());
  const std::size_t w = std::size_t(world);
  if (drop_last) {
    rest.resize(rest.size() / w * w);
  } else if (!order.empty()) {
    for (std::size_t i = 0; rest.size() % w != 0; ++i) rest.push_back(order[i % order.size()]);
  }
  std::vector<std::int64_t> mine;
  for (std::size_t i = std::size_t(rank); i < rest.size(); i += w) mine.push_back(rest[i]);
  return mine;
}

}  // namespace ddp
