#pragma once
// Binding a rank to its GPU (the choice itself is ddp::pick_device, tested on the CPU).

#include <cstdint>
#include <string>

#include "comm/backend.hpp"

namespace ddp::cuda {

// Ask CUDA for the visible devices (CUDA_VISIBLE_DEVICES applies), pick one for this
// node-local rank, cudaSetDevice it. Returns device -1 and reason "no CUDA device
// (...)" when there is none or cudaGetDeviceCount fails (no driver): never aborts.
DeviceChoice bind_device(int local_rank);

// The PCI bus id of the current device ("0000:3B:00.0"): what tells two ranks'
// GPUs apart (ddp::shared_gpus), whatever CUDA_VISIBLE_DEVICES numbers them.
std::string current_bus_id();

// The current device's UUID in hex: what tells MIG instances of one GPU apart, which
// share its PCI bus id (each has its own memory).
std::string current_uuid();

// cudaGetDeviceCount, 0 on any failure; `why` (optional) receives CUDA's error text.
int device_count(std::string* why = nullptr);

// The current device's memory in use (total - free, every process's) and its total,
// in bytes, from cudaMemGetInfo; false (and -1s) when CUDA cannot tell.
bool device_memory(std::int64_t* used, std::int64_t* total);

}  // namespace ddp::cuda
