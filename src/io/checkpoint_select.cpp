// Where a run starts (io/checkpoint.hpp): the run directory's checkpoints in the
// order resume 'auto' tries them, the choice rank 0 makes among them (or
// io.resume's path, or io.init_from's weights), its broadcast to every rank, and the
// resumed epoch's sample order.
#include <algorithm>
#include <cstring>
#include <fstream>

#include "comm/backend.hpp"
#include "comm/check.hpp"
#include "comm/fault_injection.hpp"
#include "comm/log.hpp"
#include "comm/mpi_wait.hpp"
#include "comm/watchdog.hpp"
#include "io/checkpoint_format.hpp"

namespace ddp {

namespace {

// ---- broadcast of a Checkpoint (rank 0's) as one byte buffer

struct Packer {
  std::vector<char> buf;
  std::size_t at = 0;
  std::vector<std::uint64_t> sizes;  // of the large vectors, sent apart (fields below)
  template <class T>
  void put(const T& v) {
    const char* p = reinterpret_cast<const char*>(&v);
    buf.insert(buf.end(), p, p + sizeof(T));
  }
  void put(const std::string& s) {
    put(std::uint64_t(s.size()));
    buf.insert(buf.end(), s.begin(), s.end());
  }
  template <class T>
  void put(const std::vector<T>& v) {  // T: a number
    put(std::uint64_t(v.size()));
    const char* p = reinterpret_cast<const char*>(v.data());
    buf.insert(buf.end(), p, p + v.size() * sizeof(T));
  }
  void put(const std::vector<std::string>& v) {
    put(std::uint64_t(v.size()));
    for (const auto& s : v) put(s);
  }
  template <class T>
  void get(T& v) {
    std::memcpy(&v, buf.data() + at, sizeof(T));
    at += sizeof(T);
  }
  void get(std::string& s) {
    std::uint64_t n;
    get(n);
    s.assign(buf.data() + at, n);
    at += n;
  }
  template <class T>
  void get(std::vector<T>& v) {
    std::uint64_t n;
    get(n);
    v.resize(n);
    // An empty vector's data() may be null, and memcpy from or to null is undefined
    // even for 0 bytes (a model without buffers sends none).
    if (n != 0) std::memcpy(v.data(), buf.data() + at, n * sizeof(T));
    at += n * sizeof(T);
  }
  void get(std::vector<std::string>& v) {
    std::uint64_t n;
    get(n);
    v.resize(n);
    for (auto& s : v) get(s);
  }
};

// The Checkpoint's fields but the large ones, whose sizes alone go in the buffer
// (into `sizes` on both sides, in order: parameters, buffers, each optimizer state;
// their values are sent into place afterwards, broadcast_values and scatter_values).
template <class P, class C>
void fields(P& p, C& c) {
  p.put_or_get(c.path);
  p.put_or_get(c.state);
  p.put_or_get_size(c.parameters);
  p.put_or_get_size(c.buffers);
  p.put_or_get(c.optimizer);
  p.put_or_get(c.optimizer_steps);
  std::uint64_t n = c.optimizer_state.size();
  p.put_or_get(n);
  c.optimizer_state.resize(n);
  for (auto& [name, v] : c.optimizer_state) {
    p.put_or_get(name);
    p.put_or_get_size(v);
  }
  p.put_or_get(c.config);
  std::uint8_t has_data = c.data.has_value();
  p.put_or_get(has_data);
  if (has_data) {
    if (!c.data) c.data.emplace();
    p.put_or_get(c.data->files);
    p.put_or_get(c.data->counts);
    p.put_or_get(c.data->hashes);
    p.put_or_get(c.data->x_shape);
    p.put_or_get(c.data->y_shape);
  }
}
struct Put : Packer {
  template <class T>
  void put_or_get(const T& v) {
    put(v);
  }
  void put_or_get_size(const std::vector<float>& v) {
    sizes.push_back(v.size());
    put(sizes.back());
  }
};
struct Get : Packer {
  template <class T>
  void put_or_get(T& v) {
    get(v);
  }
  void put_or_get_size(const std::vector<float>&) {  // sized by the receiver, to what it receives
    sizes.emplace_back();
    get(sizes.back());
  }
};

// MPI counts are ints: point-to-point values go in pieces of at most 2^30.
constexpr std::int64_t kPiece = std::int64_t(1) << 30;

// Rank 0's `v` (n numbers or bytes) into every rank's.
template <class T>
void broadcast_values(MPI_Comm comm, int rank, std::uint64_t n, std::vector<T>& v) {
  if (rank != 0) v.resize(n);
  broadcast_bytes(comm, v.data(), v.size() * sizeof(T), 0);
}

// Rank 0's whole `v` (shares.back() values); rank r > 0 receives [shares[r],
// shares[r + 1]) into its `v`, sized to that. Rank 0 keeps the whole. Point to point
// from rank 0, in pieces: MPI_Scatterv's int displacements end at 2^31 values.
void scatter_values(MPI_Comm comm, int rank, const std::vector<std::int64_t>& shares, std::vector<float>& v) {
  const int world = int(shares.size()) - 1;
  auto begin = [&](int r) { return shares[std::size_t(r)]; };
  auto size = [&](int r) { return shares[std::size_t(r) + 1] - shares[std::size_t(r)]; };
  if (rank != 0) {
    v.resize(std::size_t(size(rank)));
    for (std::int64_t at = 0; at < size(rank); at += kPiece)
      MPI_CHECK(MPI_Recv(v.data() + at, int(std::min(size(rank) - at, kPiece)), MPI_FLOAT, 0, 0, comm,
                         MPI_STATUS_IGNORE));
    return;
  }
  std::vector<MPI_Request> sends;
  for (int r = 1; r < world; ++r)
    for (std::int64_t at = 0; at < size(r); at += kPiece) {
      sends.emplace_back();
      MPI_CHECK(MPI_Isend(v.data() + begin(r) + at, int(std::min(size(r) - at, kPiece)), MPI_FLOAT, r, 0,
                          comm, &sends.back()));
    }
  MPI_CHECK(MPI_Waitall(int(sends.size()), sends.data(), MPI_STATUSES_IGNORE));
}

// Rank 0's Checkpoint on every rank: the small fields packed into one buffer, the
// values sent straight into their vectors (no rank holds them twice), each rank's
// share alone of the optimizer state where `shares` is given; no values where
// `values` is false.
void broadcast_checkpoint(MPI_Comm comm, int rank, Checkpoint& ck, const std::vector<std::int64_t>* shares,
                          bool values) {
  Put out;
  if (rank == 0) fields(out, ck);
  long long n = (long long)out.buf.size();
  MPI_CHECK(MPI_Bcast(&n, 1, MPI_LONG_LONG, 0, comm));
  broadcast_values(comm, rank, std::uint64_t(n), out.buf);
  std::vector<std::uint64_t> sizes = std::move(out.sizes);
  if (rank != 0) {
    Get in;
    in.buf = std::move(out.buf);
    fields(in, ck);
    sizes = std::move(in.sizes);
  }
  if (!values) return;
  broadcast_values(comm, rank, sizes[0], ck.parameters);
  broadcast_values(comm, rank, sizes[1], ck.buffers);
  for (std::size_t i = 0; i < ck.optimizer_state.size(); ++i) {
    auto& [name, v] = ck.optimizer_state[i];
    const std::uint64_t whole = sizes[2 + i];
    if (!shares) {
      broadcast_values(comm, rank, whole, v);
      continue;
    }
    // Decided alike on every rank (the sizes came in the buffer): a state that is
    // not of the shares' length cannot be cut into them.
    DDP_REQUIRE(std::int64_t(whole) == shares->back(),
                "checkpoint " << ck.path << ": /optimizer/" << name << " holds " << whole
                              << " values, the shares " << shares->back());
    scatter_values(comm, rank, *shares, v);
  }
  if (shares && rank != 0) ck.optimizer_offset = (*shares)[std::size_t(rank)];
}

// ---- rank 0's choice

enum Found { kNone = 0, kResume = 1, kInitFrom = 2 };

// io.resume: the checkpoint to continue, into `ck`; kNone when there is none.
// InputError when io.resume names an unusable file.
Found resume_from(const ResumeOptions& o, const Model& model, const std::string& optimizer, Checkpoint& ck) {
  if (o.resume == "auto") {
    for (const std::string& path : checkpoint_candidates(o.run_dir)) {
      try {
        ck = load_checkpoint(path, model, optimizer);
        return kResume;
      } catch (const CheckpointError& e) {
        log::warn("checkpoint " + path + " is unusable (" + e.what() + "); trying the previous one");
      }
    }
  } else if (o.resume != "never") {
    try {
      ck = load_checkpoint(o.resume, model, optimizer);
      return kResume;
    } catch (const CheckpointError& e) {
      throw InputError("io.resume: checkpoint " + o.resume + " is unusable: " + e.what());
    }
  }
  return kNone;
}

// Rank 0: what the run starts from, into `ck`; an InputError's text into `problem`.
Found choose(const ResumeOptions& o, const Model& model, const std::string& optimizer,
             const DataFingerprint* data, Checkpoint& ck, std::string& problem) {
  try {
    Found found = resume_from(o, model, optimizer, ck);
    if (found && data) ckpt::check_training_data(ck, *data, o.allow_data_change);
    if (!found && !o.init_from.empty()) {
      try {
        ck = load_initial_weights(o.init_from, model);
        found = kInitFrom;
      } catch (const CheckpointError& e) {
        throw InputError("io.init_from: " + o.init_from + " is unusable: " + e.what());
      }
    }
    return found;
  } catch (const InputError& e) {
    problem = e.what();
    return kNone;
  }
}

}  // namespace

std::vector<std::string> checkpoint_candidates(const std::string& run_dir) {
  const std::string dir = checkpoint_dir(run_dir);
  std::vector<std::string> names;
  for (const std::string& n : ckpt::list_dir(dir))
    if (ckpt::is_checkpoint_name(n)) names.push_back(n);
  std::reverse(names.begin(), names.end());  // newest first
  std::ifstream in(dir + "/latest");
  std::string latest;
  if (in >> latest) {
    auto it = std::find(names.begin(), names.end(), latest);
    if (it != names.end()) std::rotate(names.begin(), it, it + 1);
  }
  for (auto& n : names) n = dir + "/" + n;
  return names;
}

std::optional<Checkpoint> find_start_checkpoint(MPI_Comm comm, const ResumeOptions& options,
                                                const Model& model, const std::string& optimizer,
                                                bool* weights_only, const DataFingerprint* data,
                                                const std::vector<std::int64_t>* shares, bool values) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  Checkpoint ck;
  int found = kNone;
  std::string problem;
  if (rank == 0) {
    const watchdog::During reading(Phase::checkpoint);
    inject_fault(FaultSite::start_checkpoint, 0);
    found = choose(options, model, optimizer, data, ck, problem);
  }
  int status[2] = {found, problem.empty() ? 0 : 1};
  {
    const watchdog::Collective guard("the choice of the checkpoint to start from (MPI_Bcast)");
    MPI_CHECK(bcast_waiting(status, 2, MPI_INT, 0, comm));  // while rank 0 reads
  }
  if (status[1]) fatal_all(comm, problem);
  if (weights_only) *weights_only = status[0] == kInitFrom;
  if (status[0] == kNone) return std::nullopt;
  {
    const watchdog::Collective guard("the broadcast of the checkpoint to start from");
    broadcast_checkpoint(comm, rank, ck, shares, values);
  }
  return ck;
}

}  // namespace ddp
