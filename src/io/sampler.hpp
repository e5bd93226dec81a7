#pragma once
// PyTorch's DistributedSampler: every epoch one permutation of the whole data set,
// the same on every rank; rank r takes positions r, r+W, r+2W, ...
// The permutation is our own (mt19937_64 + Fisher-Yates with an unbiased bounded
// draw), so it is identical on every compiler and standard library, though not
// the same numbers as torch.randperm.

#include <cstdint>
#include <vector>

namespace ddp {

class DistributedSampler {
 public:
  // Throws InputError on num_replicas < 1 or rank outside [0, num_replicas).
  DistributedSampler(std::int64_t dataset_size, int num_replicas, int rank, bool shuffle, std::uint64_t seed,
                     bool drop_last);

  void set_epoch(std::int64_t epoch) { epoch_ = epoch; }
  std::int64_t epoch() const { return epoch_; }

  std::int64_t num_samples() const { return num_samples_; }  // per rank
  std::int64_t total_size() const { return num_samples_ * num_replicas_; }

  // The epoch's order over all ranks, length total_size(): the permutation seeded
  // by seed+epoch, padded by repeating it from the start (drop_last=false) or
  // truncated (drop_last=true), as torch does.
  std::vector<std::int64_t> global_order() const;
  // This rank's share: global_order()[rank], [rank+W], ...; length num_samples().
  std::vector<std::int64_t> indices() const;

 private:
  std::int64_t size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  std::uint64_t seed_;
  bool drop_last_;
  std::int64_t num_samples_;
  std::int64_t epoch_ = 0;
};

// A permutation of 0..n-1 that depends only on `seed` (see the header comment).
std::vector<std::int64_t> seeded_permutation(std::int64_t n, std::uint64_t seed);

// Validation share, no padding: rank, rank+W, ... < n; every sample on exactly one rank.
std::vector<std::int64_t> shard_indices(std::int64_t n, int num_replicas, int rank);

// The order of this rank's samples for epoch `epoch` when `consumed` positions of
// the epoch's global order are already trained (possibly by a run with another
// number of ranks). consumed == 0: DistributedSampler(...).indices(). Otherwise the
// unpadded order P (the seeded permutation, or 0..N-1 unshuffled), its positions
// [consumed, N) in order, padded by cycling P from its start (or truncated, drop_last)
// to a multiple of `world`, dealt round-robin: rank r takes R[r], R[r+W], ...
// With the same number of ranks and consumed a multiple of it this is exactly the
// tail of the uninterrupted epoch's indices().
std::vector<std::int64_t> epoch_indices(std::int64_t dataset_size, int world, int rank, bool shuffle,
                                        std::uint64_t seed, bool drop_last, std::int64_t epoch,
                                        std::int64_t consumed);

}  // namespace ddp
