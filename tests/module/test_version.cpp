// version_text(): every field of `ddp_train --version` is there and agrees with
// the libraries this test itself is compiled and linked against.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <regex>
#include <string>

#include "train/version.hpp"

namespace {

// The value after "  <field>:" on its own line, or "" when the field is missing.
std::string field(const std::string& text, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex("\n  " + name + ": +([^\n]*)\n"))) return "";
  return m[1];
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
  EXPECT_TRUE(std::regex_search(field(text, "compute"), std::regex("^oneDNN [0-9.]+, (AVX|SSE)"))) << text;
  EXPECT_TRUE(std::regex_search(field(text, "bf16"), std::regex("^(oneDNN's bf16 kernels|emulated)")))
      << text;
#else
  EXPECT_NE(field(text, "compute").find("cuDNN"), std::string::npos) << text;
#endif
  EXPECT_TRUE(std::regex_search(field(text, "git revision"), std::regex("^([0-9a-f]{7,}(-dirty)?|unknown)$")))
      << text;
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
