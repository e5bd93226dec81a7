#pragma once
// Compute precision of GEMM and convolution operands (train.precision). Master
// weights, activations between layers, gradients and the optimizer stay fp32;
// only the operands of the GEMMs and convolutions are rounded to bf16 or fp16,
// and their products accumulate in fp32 (cuBLAS/cuDNN with fp32 compute, oneDNN
// with fp32 destinations).
//
// On the host, bf16 runs on oneDNN's bf16 kernels where the CPU has them (AVX-512
// BF16, AMX) and fp16 is emulated: operands are rounded to fp16 values and
// multiplied in fp32, which gives the same sums as fp16 operands with fp32
// accumulation (a product of two fp16 values is exact in fp32), overflow to inf
// included, at fp32 speed.

#include <cstdint>
#include <string>

namespace ddp {

enum class Precision { fp32, bf16, fp16 };

const char* precision_name(Precision p);             // "fp32"
Precision parse_precision(const std::string& name);  // throws InputError on anything else

// out[i] = in[i] rounded to the nearest bf16 / fp16 value (ties to even), kept in
// fp32. fp16: beyond 65504 becomes +-inf, below 2^-24 flushes to (signed) zero.
// fp32: a copy. in == out is allowed.
void round_to_precision(Precision p, const float* in, float* out, std::int64_t n);

// Why a GPU of compute capability major.minor has no tensor cores for `p`: bf16 needs
// 8.0 (Ampere) or newer, fp16 7.0 (Volta) or newer. Empty where it has them, and
// for fp32.
std::string missing_tensor_cores(Precision p, int major, int minor);

// One value, for tests and references.
float round_bf16(float x);
float round_fp16(float x);

}  // namespace ddp
