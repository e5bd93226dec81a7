#include "comm/node_shared.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "comm/bytes_text.hpp"
#include "comm/check.hpp"
#include "comm/fault_injection.hpp"
#include "comm/watchdog.hpp"

namespace ddp {
namespace {

// posix_fallocate's ENOSPC: the size of /dev/shm (a container's is often 64 MB).
std::string no_space_text(std::size_t bytes) {
  struct statvfs st {};
  if (statvfs("/dev/shm", &st) != 0) return "/dev/shm has no room for " + mib_text(double(bytes));
  return "/dev/shm has " + mib_text(double(st.f_bavail) * double(st.f_frsize)) + " free of " +
         mib_text(double(st.f_blocks) * double(st.f_frsize)) + ", " + mib_text(double(bytes)) + " needed";
}

}  // namespace

std::unique_ptr<NodeShared> NodeShared::make(MPI_Comm comm, std::size_t bytes, std::string* why) {
  int rank = 0, local = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  std::unique_ptr<NodeShared> s(new NodeShared);
  MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &s->node_));
  MPI_CHECK(MPI_Comm_rank(s->node_, &local));
  MPI_CHECK(MPI_Comm_split(comm, local == 0 ? 0 : MPI_UNDEFINED, rank, &s->firsts_));
  s->size_ = std::max<std::size_t>(bytes, 1);

  // The object is named only while it holds no memory: made sparse (ftruncate),
  // mapped by the node's ranks, its name removed, and only then its memory reserved.
  // A rank killed on the way (the kernel's out-of-memory killer in posix_fallocate,
  // a scancel) leaves at most an empty name in /dev/shm, never memory no one frees.
  static int made = 0;  // this process's segments, each under a name of its own
  char name[96] = {0};
  std::string created, problem;
  int fd = -1;
  if (local == 0) {
    std::snprintf(name, sizeof name, "/ddp_train.%ld.%d", long(getpid()), ++made);
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      problem = std::string("shm_open(") + name + "): " + std::strerror(errno);
    } else {
      created = name;
      if (ftruncate(fd, off_t(s->size_)) != 0) problem = std::string("ftruncate: ") + std::strerror(errno);
    }
    if (!problem.empty()) name[0] = 0;  // the node's other ranks map nothing
  }
  {
    const watchdog::Collective guard("the making of the node's shared memory (MPI_Bcast)");
    MPI_CHECK(MPI_Bcast(name, int(sizeof name), MPI_CHAR, 0, s->node_));
  }
  if (local != 0) {
    if (!name[0])
      problem = "its node's first rank made no shared memory";
    else if ((fd = shm_open(name, O_RDWR, 0)) < 0)
      problem = std::string("shm_open(") + name + "): " + std::strerror(errno);
  }
  if (problem.empty()) {
    void* p = mmap(nullptr, s->size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
      problem = "mmap of " + mib_text(double(s->size_)) + " of shared memory: " + std::strerror(errno);
    else
      s->data_ = static_cast<std::uint8_t*>(p);
  }
  if (local != 0 && fd >= 0) close(fd);
  {
    // Every rank of the node has it mapped, or has failed: the name can go.
    const watchdog::Collective guard("the mapping of the node's shared memory (MPI_Barrier)");
    MPI_CHECK(MPI_Barrier(s->node_));
  }
  if (!created.empty()) shm_unlink(created.c_str());
  if (local == 0 && fd >= 0) {
    // All of it now: a /dev/shm too small is ENOSPC here, not a SIGBUS at a first touch.
    if (problem.empty())
      if (const int e = posix_fallocate(fd, 0, off_t(s->size_)))
        problem = e == ENOSPC ? no_space_text(s->size_) : std::string("posix_fallocate: ") + std::strerror(e);
    inject_fault(FaultSite::node_shared, 0);
    close(fd);
  }

  // All ranks or none; the lowest failing rank says why.
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  *why = first_words(comm,
                     problem.empty() ? "" : "rank " + std::to_string(rank) + " (" + host + "): " + problem);
  if (why->empty()) return s;
  return nullptr;
}

NodeShared::~NodeShared() {
  if (data_) munmap(data_, size_);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
  if (firsts_ != MPI_COMM_NULL) MPI_Comm_free(&firsts_);
}

}  // namespace ddp
