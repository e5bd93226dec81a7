#include "comm/log.hpp"

#include <cstdio>

namespace ddp::log {

namespace {
int g_rank = 0;
}

void set_rank(int r) { g_rank = r; }
int rank() { return g_rank; }

void info(const std::string& msg) {
  if (g_rank != 0) return;
  std::fprintf(stdout, "%s\n", msg.c_str());
  std::fflush(stdout);
}

void warn(const std::string& msg) {
  std::fprintf(stderr, "rank %d: warning: %s\n", g_rank, msg.c_str());
  std::fflush(stderr);
}

void error(const std::string& msg) {
  std::fprintf(stderr, "rank %d: error: %s\n", g_rank, msg.c_str());
  std::fflush(stderr);
}

}  // namespace ddp::log
