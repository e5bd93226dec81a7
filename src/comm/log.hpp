#pragma once
// Rank-aware logging: info comes from rank 0 only; warnings and errors from any
// rank, prefixed with that rank's number. Lines are written whole (one fprintf).

#include <string>
#include <vector>

namespace ddp::log {

void set_rank(int rank);  // called once by Context
int rank();

void info(const std::string& msg);   // rank 0 only, stdout
void warn(const std::string& msg);   // any rank, stderr: "rank N: warning: msg"
void error(const std::string& msg);  // any rank, stderr: "rank N: error: msg"

// Ascending rank numbers as ranges for a message: {0, 1, 2, 5} -> "0-2,5".
std::string ranks_text(const std::vector<int>& ranks);

}  // namespace ddp::log
