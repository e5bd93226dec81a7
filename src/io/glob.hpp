#pragma once
// Shell-style file patterns (POSIX glob(3)) for the data.*_files keys.

#include <string>
#include <vector>

namespace ddp {

// Expands every pattern, each one's matches sorted (byte order, not the locale's),
// concatenated in pattern order, duplicates dropped (first occurrence kept).
// A pattern matching nothing that is not itself an existing file throws
// InputError "<what>: '<pattern>' matches no file"; so does an empty list.
std::vector<std::string> expand_globs(const std::vector<std::string>& patterns, const std::string& what);

}  // namespace ddp
