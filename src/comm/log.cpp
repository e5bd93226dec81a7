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

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? "," : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace ddp::log
