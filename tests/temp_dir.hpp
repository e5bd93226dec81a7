#pragma once
// A directory of a test's own under /tmp, removed with what it holds when the test
// ends, passed or failed: a suite run leaves nothing behind in /tmp.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace ddp::test {

class TempDir {
 public:
  // prefix: "/tmp/name_", to which mkdtemp adds six characters of its own.
  explicit TempDir(const std::string& prefix) {
    std::string tmpl = prefix + "XXXXXX";
    const char* made = mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr) << "mkdtemp " << tmpl;
    if (made) path_ = made;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace ddp::test
