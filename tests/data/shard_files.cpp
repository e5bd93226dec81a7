#include "shard_files.hpp"

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>

namespace ddp::test {

namespace {
void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("write_shard: ") + what);
}

void write_dataset(hid_t file, const char* name, hid_t file_type, hid_t mem_type,
                   const std::vector<hsize_t>& dims, const void* data) {
  const hid_t space = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
  const hid_t d = H5Dcreate2(file, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  check(d >= 0, name);
  check(H5Dwrite(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0, name);
  H5Dclose(d);
  H5Sclose(space);
}
}  // namespace

void write_shard(const std::string& path, const ShardSpec& s) {
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  check(f >= 0, path.c_str());
  std::int64_t numel = 1;
  for (auto d : s.sample_shape) numel *= std::int64_t(d);
  std::vector<hsize_t> xdims{hsize_t(s.count)};
  xdims.insert(xdims.end(), s.sample_shape.begin(), s.sample_shape.end());
  if (s.write_x) {
    if (s.x_uint8) {
      std::vector<std::uint8_t> x(std::size_t(s.count * numel));
      for (std::int64_t i = 0; i < s.count; ++i)
        for (std::int64_t k = 0; k < numel; ++k) x[i * numel + k] = x_u8(s.first + i, k);
      write_dataset(f, "/x", s.x_type >= 0 ? s.x_type : H5T_STD_U8LE, H5T_NATIVE_UINT8, xdims, x.data());
    } else {
      std::vector<float> x(std::size_t(s.count * numel));
      for (std::int64_t i = 0; i < s.count; ++i)
        for (std::int64_t k = 0; k < numel; ++k) x[i * numel + k] = x_f32(s.first + i, k);
      write_dataset(f, "/x", s.x_type >= 0 ? s.x_type : H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, xdims, x.data());
    }
  }
  if (s.write_y) {
    const std::int64_t ny = s.y_count >= 0 ? s.y_count : s.count;
    if (s.labels) {
      std::vector<std::int64_t> y(static_cast<std::size_t>(ny));
      for (std::int64_t i = 0; i < ny; ++i) y[i] = (s.first + i) % s.classes;
      write_dataset(f, "/y", H5T_STD_I64LE, H5T_NATIVE_INT64, {hsize_t(ny)}, y.data());
    } else {
      std::int64_t tn = 1;
      for (auto d : s.target_shape) tn *= std::int64_t(d);
      std::vector<float> y(std::size_t(ny * tn));
      for (std::int64_t i = 0; i < ny; ++i)
        for (std::int64_t t = 0; t < tn; ++t) y[i * tn + t] = target_value(s.first + i, t);
      std::vector<hsize_t> ydims{hsize_t(ny)};
      ydims.insert(ydims.end(), s.target_shape.begin(), s.target_shape.end());
      write_dataset(f, "/y", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, ydims, y.data());
    }
  }
  H5Fclose(f);
}

std::string make_shared_tmpdir(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  char name[64] = "/tmp/ddp_data_test_XXXXXX";
  if (rank == 0 && mkdtemp(name) == nullptr) throw std::runtime_error("mkdtemp failed");
  MPI_Bcast(name, sizeof name, MPI_CHAR, 0, comm);
  return name;
}

void remove_shared_tmpdir(MPI_Comm comm, const std::string& dir) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Barrier(comm);
  if (rank == 0) std::filesystem::remove_all(dir);
}

}  // namespace ddp::test
