#include "cuda/device.hpp"

#include <cstdio>
#include <cstdlib>

#include "cuda/cuda_check.hpp"

namespace ddp::cuda {

int device_count(std::string* why) {
  int n = 0;
  cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    if (why) *why = std::string(cudaGetErrorName(rc)) + ": " + cudaGetErrorString(rc);
    cudaGetLastError();  // clear it so that later calls start clean
    return 0;
  }
  if (why) *why = n > 0 ? "" : "cudaGetDeviceCount = 0";
  return n;
}

bool device_memory(std::int64_t* used, std::int64_t* total) {
  std::size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    *used = *total = -1;
    return false;
  }
  *used = std::int64_t(total_bytes - free_bytes);
  *total = std::int64_t(total_bytes);
  return true;
}

std::string current_bus_id() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  char id[64] = "";
  CUDA_CHECK(cudaDeviceGetPCIBusId(id, int(sizeof id), device));
  return id;
}

std::string current_uuid() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::string hex;
  char two[3];
  for (char c : prop.uuid.bytes) {
    std::snprintf(two, sizeof two, "%02x", static_cast<unsigned char>(c));
    hex += two;
  }
  return hex;
}

DeviceChoice bind_device(int local_rank) {
  std::string why;
  int n = device_count(&why);
  DeviceChoice d = pick_device(n, local_rank, std::getenv("SLURM_LOCALID"));
  if (d.device < 0) {
    d.reason = "no CUDA device (" + why + ")";
    return d;
  }
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES"))
    d.reason += std::string(", CUDA_VISIBLE_DEVICES=") + visible;
  CUDA_CHECK(cudaSetDevice(d.device));
  return d;
}

}  // namespace ddp::cuda
