#pragma once
// The one oneDNN CPU engine and stream of a process. oneDNN (Debian: OpenMP runtime)
// runs on ONE thread per rank unless OMP_NUM_THREADS or DDP_DNNL_THREADS is set,
// because ranks are processes pinned one per core; a hybrid run sets either one.

#include <dnnl.hpp>
#include <string>

#include "model/precision.hpp"

namespace ddp {

dnnl::engine& dnnl_engine();
dnnl::stream& dnnl_stream();

// Threads oneDNN primitives use (after the first dnnl_engine() call).
int dnnl_threads();

// Whether oneDNN has bf16 kernels on this CPU (AVX-512 BF16, AMX; also avx512_core,
// where oneDNN converts in its kernels). Asked once, by creating a bf16 matmul and a
// bf16 convolution: where either cannot be created (AVX2), bf16 is emulated, as fp16
// always is: the operands are rounded to bf16 values and multiplied in fp32.
struct DnnlBf16 {
  bool native = false;
  std::string impl;  // the bf16 matmul oneDNN picked, e.g. "brg:avx512_core_bf16"; "" when none
};
const DnnlBf16& dnnl_bf16();

// The instruction set oneDNN dispatches to ("AVX2", "AVX-512 BF16"); ONEDNN_MAX_CPU_ISA caps it.
const char* dnnl_isa_name();

// How a precision runs here, for rank 0's start-up line and --version:
// "bf16 (oneDNN brg:avx512_core_bf16)", "bf16 (emulated: no bf16 instructions on this CPU)".
std::string dnnl_precision_text(Precision p);

}  // namespace ddp
