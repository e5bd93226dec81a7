#pragma once
// Bytes held once per node and read by every rank on it: a POSIX shared-memory
// object (/dev/shm) that the node's first rank makes and the others map. A preload
// then costs a node one copy of the data, not one per rank.
//
// The object's name is removed as soon as every rank of the node has it mapped, and
// before its memory is reserved, so a rank killed at any point leaves no memory in
// /dev/shm; the memory goes back when the node's last rank unmaps it or ends.
// posix_fallocate then reserves the whole size: a /dev/shm too small for it is a
// failure here, not a SIGBUS at the first touch.

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ddp {

class NodeShared {
 public:
  // Collective over `comm`. Every rank gets its node's segment of `bytes`, or every
  // rank gets nullptr and *why says which rank failed and how.
  static std::unique_ptr<NodeShared> make(MPI_Comm comm, std::size_t bytes, std::string* why);
  ~NodeShared();
  NodeShared(const NodeShared&) = delete;
  NodeShared& operator=(const NodeShared&) = delete;

  std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  // The node's first rank fills the segment; firsts() joins the nodes' first ranks
  // (in `comm`'s order: its rank 0 is comm's rank 0), MPI_COMM_NULL on the others.
  bool first() const { return firsts_ != MPI_COMM_NULL; }
  MPI_Comm firsts() const { return firsts_; }
  MPI_Comm node() const { return node_; }

 private:
  NodeShared() = default;
  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  MPI_Comm node_ = MPI_COMM_NULL, firsts_ = MPI_COMM_NULL;
};

}  // namespace ddp
