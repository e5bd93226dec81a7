// The training data a checkpoint was written on (io/checkpoint.hpp, /data/train)
// against the data a resume runs on.
#include <algorithm>
#include <map>
#include <sstream>

#include "comm/check.hpp"
#include "comm/log.hpp"
#include "io/checkpoint_format.hpp"
#include "io/shard_check.hpp"

namespace ddp {

namespace ckpt {

std::optional<DataFingerprint> read_fingerprint(const FileContents& c) {
  if (!c.files) return std::nullopt;
  DataFingerprint d;
  std::istringstream lines(*c.files);
  for (std::string line; std::getline(lines, line);) d.files.push_back(line);
  d.counts = need_ints(c.blobs, "/data/train/counts");
  for (std::int64_t h : need_ints(c.blobs, "/data/train/hashes")) d.hashes.push_back(std::uint64_t(h));
  d.x_shape = need_ints(c.blobs, "/data/train/x_shape");
  d.y_shape = need_ints(c.blobs, "/data/train/y_shape");
  if (d.files.size() != d.counts.size() || d.hashes.size() != d.counts.size())
    throw CheckpointError("/data/train names " + std::to_string(d.files.size()) + " files but has " +
                          std::to_string(d.counts.size()) + " counts");
  return d;
}

void check_training_data(const Checkpoint& ck, const DataFingerprint& now, bool allow_change) {
  if (!ck.data) {
    log::warn("checkpoint " + ck.path +
              " has no record of its training data (written before ddp_train kept one): the data this "
              "run resumes on cannot be checked against it");
    return;
  }
  const DataChange c = compare_data(*ck.data, now);
  const std::string since = "the training data changed since checkpoint " + ck.path + " was written (";
  if (!c.count.empty() && !allow_change)
    throw InputError(since + c.count +
                     "); its sampler position would continue the epoch on other samples. Set "
                     "io.allow_data_change = T to continue on this data anyway");
  if (!c.count.empty())
    log::warn(since + c.count + "); continuing on it (io.allow_data_change = T)");
  else if (!c.other.empty())
    log::warn(since + c.other + "; the same " + std::to_string(now.samples()) +
              " samples in all); continuing");
}

}  // namespace ckpt

namespace {

std::string samples(std::int64_t n) { return std::to_string(n) + (n == 1 ? " sample" : " samples"); }

// The files' changes, in the order of `now`: gone, new, other counts or contents, reordered.
std::vector<std::string> file_changes(const DataFingerprint& then, const DataFingerprint& now) {
  std::vector<std::string> changes;
  std::map<std::string, std::size_t> then_at, now_at;
  for (std::size_t i = 0; i < then.files.size(); ++i) then_at[then.files[i]] = i;
  for (std::size_t i = 0; i < now.files.size(); ++i) now_at[now.files[i]] = i;
  for (std::size_t i = 0; i < then.files.size(); ++i)
    if (!now_at.count(then.files[i]))
      changes.push_back(then.files[i] + " (" + samples(then.counts[i]) + ") is gone");
  for (std::size_t i = 0; i < now.files.size(); ++i)
    if (!then_at.count(now.files[i]))
      changes.push_back(now.files[i] + " (" + samples(now.counts[i]) + ") is new");
  std::vector<std::size_t> order;  // where the files of both were then, in the order of now
  for (std::size_t i = 0; i < now.files.size(); ++i) {
    const auto it = then_at.find(now.files[i]);
    if (it == then_at.end()) continue;
    const std::size_t j = it->second;
    order.push_back(j);
    if (then.counts[j] != now.counts[i])
      changes.push_back(now.files[i] + " has " + samples(now.counts[i]) + ", had " +
                        std::to_string(then.counts[j]));
    else if (then.hashes[j] != now.hashes[i])
      changes.push_back(now.files[i] + " has other contents in its sampled rows");
  }
  // Another order of the same files renumbers the samples the sampler position counts.
  if (!std::is_sorted(order.begin(), order.end())) changes.push_back("the files are in another order");
  return changes;
}

}  // namespace

DataChange compare_data(const DataFingerprint& then, const DataFingerprint& now) {
  std::vector<std::string> changes = file_changes(then, now);
  if (then.x_shape != now.x_shape)
    changes.push_back("samples are " + shard::shape_str(now.x_shape) + ", were " +
                      shard::shape_str(then.x_shape));
  if (then.y_shape != now.y_shape)
    changes.push_back("targets are " + shard::shape_str(now.y_shape) + ", were " +
                      shard::shape_str(then.y_shape));

  constexpr std::size_t kShown = 4;  // one line, also for a thousand shards
  std::string list;
  for (std::size_t i = 0; i < std::min(changes.size(), kShown); ++i) list += (i ? "; " : "") + changes[i];
  if (changes.size() > kShown) list += "; and " + std::to_string(changes.size() - kShown) + " more changes";
  DataChange c;
  if (then.samples() != now.samples())
    c.count =
        std::to_string(then.samples()) + " samples then, " + std::to_string(now.samples()) + " now: " + list;
  else
    c.other = list;
  return c;
}

}  // namespace ddp
