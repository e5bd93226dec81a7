// version_text(): every field of `ddp_train --version` is there and agrees with
// the libraries this test itself is compiled and linked against.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <string>

#include "train/version.hpp"

namespace {

// The value after "  <field>:" and its spaces on its own line, or "" when the field is
// missing. (By hand, not std::regex: GCC's sanitizer build warns inside <regex>.)
std::string field(const std::string& text, const std::string& name) {
  const std::string key = "\n  " + name + ":";
  std::size_t at = text.find(key);
  if (at == std::string::npos) return "";
  at += key.size();
  if (at >= text.size() || text[at] != ' ') return "";
  at = text.find_first_not_of(' ', at);
  const std::size_t end = text.find('\n', at);
  return at == std::string::npos || end == std::string::npos ? "" : text.substr(at, end - at);
}

#if DDP_WITH_ONEDNN
bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// "oneDNN <version>, AVX..." or "..., SSE...": the instruction set oneDNN picked.
bool names_onednn_isa(const std::string& compute) {
  if (!starts_with(compute, "oneDNN ")) return false;
  const std::size_t end = compute.find_first_not_of("0123456789.", 7);
  if (end == 7 || end == std::string::npos) return false;
  const std::string rest = compute.substr(end);
  return starts_with(rest, ", AVX") || starts_with(rest, ", SSE");
}
#endif

// A git revision (7 or more hex digits, "-dirty" after it where the tree was changed)
// or "unknown".
bool is_revision(const std::string& r) {
  if (r == "unknown") return true;
  const std::string hex =
      r.size() > 6 && r.compare(r.size() - 6, 6, "-dirty") == 0 ? r.substr(0, r.size() - 6) : r;
  return hex.size() >= 7 && hex.find_first_not_of("0123456789abcdef") == std::string::npos;
}

TEST(Version, FirstLineNamesVersion) {
  const std::string text = ddp::version_text();
  std::fputs(text.c_str(), stdout);  // for the test log
  EXPECT_EQ(text.rfind(std::string("ddp_train ") + DDP_VERSION + "\n", 0), 0u) << text;
}

TEST(Version, EveryFieldIsThere) {
  const std::string text = ddp::version_text();
  for (const char* name : {"git revision", "build", "Kokkos", "MPI", "HDF5", "compute", "CUDA glue"})
    EXPECT_NE(field(text, name), "") << "no '" << name << "' line in:\n" << text;
#if DDP_WITH_ONEDNN
  // The instruction set oneDNN picked, and how bf16 runs on it.
  EXPECT_TRUE(names_onednn_isa(field(text, "compute"))) << text;
  const std::string bf16 = field(text, "bf16");
  EXPECT_TRUE(starts_with(bf16, "oneDNN's bf16 kernels") || starts_with(bf16, "emulated")) << text;
#else
  EXPECT_NE(field(text, "compute").find("cuDNN"), std::string::npos) << text;
#endif
  EXPECT_TRUE(is_revision(field(text, "git revision"))) << text;
}

TEST(Version, KokkosBackendAndDefaultSpace) {
  const std::string kokkos = field(ddp::version_text(), "Kokkos");
  EXPECT_NE(kokkos.find(Kokkos::DefaultExecutionSpace::name()), std::string::npos) << kokkos;
#if defined(KOKKOS_ENABLE_SERIAL)
  EXPECT_NE(kokkos.find("Serial"), std::string::npos) << kokkos;
#endif
#if defined(KOKKOS_ENABLE_OPENMP)
  EXPECT_NE(kokkos.find("OpenMP"), std::string::npos) << kokkos;
#endif
#if defined(KOKKOS_ENABLE_CUDA)
  EXPECT_NE(kokkos.find("CUDA"), std::string::npos) << kokkos;
#endif
}

TEST(Version, MpiIsTheLibraryVersionFirstLine) {
  char library[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(library, &len);
  std::string first(library, std::size_t(len));
  first = first.substr(0, first.find_first_of(",\n"));
  EXPECT_EQ(field(ddp::version_text(), "MPI").rfind(first, 0), 0u) << first;
}

TEST(Version, Hdf5VersionAndParallel) {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  const std::string hdf5 = field(ddp::version_text(), "HDF5");
  const std::string expected =
      std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release) + ", parallel";
  EXPECT_EQ(hdf5.rfind(expected, 0), 0u) << hdf5;
}

TEST(Version, CudaGlueOnOrOff) {
  const std::string cuda = field(ddp::version_text(), "CUDA glue");
#if defined(DDP_WITH_CUDA_GLUE) && DDP_WITH_CUDA_GLUE
  EXPECT_EQ(cuda.rfind("on", 0), 0u) << cuda;
#else
  EXPECT_EQ(cuda.rfind("off", 0), 0u) << cuda;
#endif
}

}  // namespace
