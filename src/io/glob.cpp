#include "io/glob.hpp"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <unordered_set>

#include "comm/check.hpp"

namespace ddp {

namespace {

std::vector<std::string> expand_one(const std::string& pattern, const std::string& what) {
  int flags = 0;
#ifdef GLOB_TILDE
  flags |= GLOB_TILDE;  // '~/data/*.h5' as a shell would read it
#endif
  glob_t g{};
  const int rc = glob(pattern.c_str(), flags, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) out.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH)
    throw InputError(what + ": cannot expand '" + pattern + "' (glob error " + std::to_string(rc) + ")");
  // A file whose name holds '[' or '*' does not match itself as a pattern.
  struct stat st {};
  if (out.empty() && stat(pattern.c_str(), &st) == 0) out.push_back(pattern);
  if (out.empty()) throw InputError(what + ": '" + pattern + "' matches no file");
  std::sort(out.begin(), out.end());  // glob sorts with strcoll: make it locale-free
  return out;
}

}  // namespace

std::vector<std::string> expand_globs(const std::vector<std::string>& patterns, const std::string& what) {
  if (patterns.empty()) throw InputError(what + ": no file pattern given");
  std::vector<std::string> files;
  std::unordered_set<std::string> seen;
  for (const auto& p : patterns)
    for (auto& f : expand_one(p, what))
      if (seen.insert(f).second) files.push_back(std::move(f));
  return files;
}

}  // namespace ddp
