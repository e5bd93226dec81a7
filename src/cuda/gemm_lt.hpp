#pragma once
// GEMMs with an epilogue through cuBLASLt (model/gemm.hpp's gemm_epilogue): the
// bias, a residual added (cuBLASLt's C at beta 1), the tanh GELU (its input kept for
// backward) and the GELU's gradient done by the GEMM's kernel as it stores C, as llm.c and PyTorch's addmm
// do, so that a linear's output is not read and written again by a bias pass and a GELU pass, and a narrow C
// is rounded once. Row-major operands as CublasGemm's (cuda/gemm.hpp), alpha 1 and beta 0, fp32 accumulation
// (CUBLAS_COMPUTE_32F, or its TF32 form under train.tf32 for fp32 operands); a split of k, where the
// heuristics choose one, sums its parts in fp32 (no partial sums rounded to a narrow C).
//
// The bias is fp32 beside an fp32 C; beside a narrow C it is handed over in C's type,
// as cuBLASLt documents the bias (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: "the same type
// as the elements of the output matrix") and as PyTorch's autocast gives addmm a bf16
// bias: converted on the stream into room kept after the workspace. An fp32 bias that
// lies off 16 bytes (a slice of the packed parameters may) is copied into that room
// first: the heuristics are not told the bias's alignment, and a kernel assuming 16
// would fault on a misaligned address.
//
// An algorithm is taken from cuBLASLt's heuristics once per shape, types, epilogue
// and the operands' alignment (told to the heuristics), with its descriptors, and
// kept: the same every call, so a run repeats bit for bit (cuBLAS's reproducibility
// holds for cublasLtMatmul with a workspace of the caller's, one stream). Where the
// heuristics offer none, or cuBLASLt refuses the first call of it (not supported, an
// invalid value, the architecture), the shape is declined from then on (declines()
// says so before the caller converts operands) unless another alignment of it has
// run, which keeps its path: then that key alone. The caller's fallback runs (a GEMM
// and one pass). Any other failure ends the run. The workspace is allocated once, at
// construction: nothing is allocated while a step is captured into a CUDA graph.

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "cuda/dtype.hpp"

namespace ddp::cuda {

class CublasLtGemm {
 public:
  enum class Epilogue { none, bias, gelu, gelu_bias, dgelu };

  explicit CublasLtGemm(cudaStream_t stream);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Whether a call of this shape is sure to return false (nothing asked of cuBLASLt):
  // a shape declined before, k 0, a GELU input's leading dimension off a multiple of
  // 8, a residual with a GELU, a bias wider than its room where it goes there (in C's
  // type beside a narrow C; an fp32 bias off 16 bytes). DDP_CUBLASLT_LOG=1 logs each
  // such shape once, with why.
  bool declines(bool trans_a, bool trans_b, int m, int n, int k, int lda, int ldb, int ldc, DType ab,
                DType c_type, Epilogue epilogue, bool add, const float* bias) const;

  // C (m, n) = epilogue(op(A) (m, k) op(B) (k, n) [+ add]), row-major, device memory;
  // A and B of type ab, C of c_type (fp32 or ab). bias: (n) fp32, for bias and
  // gelu_bias. aux (m, ldc) of c_type: the GELU's input, written by gelu and
  // gelu_bias, read by dgelu. add (m, ldc) of c_type, with none and bias: cuBLASLt's C
  // at beta 1 (C is then its D). Returns false where cuBLASLt has no algorithm for it
  // or refuses it.
  bool operator()(bool trans_a, bool trans_b, int m, int n, int k, const void* a, int lda, const void* b,
                  int ldb, void* c, int ldc, DType ab, DType c_type, Epilogue epilogue, const float* bias,
                  void* aux, const void* add = nullptr);

  void set_tf32(bool on) { tf32_ = on; }

 private:
  struct Descriptors;
  struct Plan {
    std::unique_ptr<Descriptors> d;
    cublasLtMatmulAlgo_t algo{};
    bool proven = false;  // it has run once
  };
  // (trans_a, trans_b, m, n, k, lda, ldb, ldc, ab, c_type, epilogue, tf32, add)
  using Shape = std::tuple<bool, bool, int, int, int, int, int, int, int, int, int, bool, bool>;
  // the shape and the alignments of cuBLASLt's A (our b), its B (our a), C, bias, aux, add
  using Key = std::tuple<Shape, int, int, int, int, int, int>;

  Shape shape_of(bool trans_a, bool trans_b, int m, int n, int k, int lda, int ldb, int ldc, DType ab,
                 DType c_type, Epilogue epilogue, bool add) const;
  void log_key(const Key& key, const char* outcome) const;

  cublasLtHandle_t handle_ = nullptr;
  cudaStream_t stream_;
  void* workspace_ = nullptr;
  bool tf32_ = false;
  std::map<Key, Plan> plans_;
  std::set<Shape> declined_;                 // no key of the shape ran
  std::set<Key> declined_keys_;              // refused where another key of the shape had run
  mutable std::set<Shape> logged_declines_;  // declines() has logged (DDP_CUBLASLT_LOG=1)
};

}  // namespace ddp::cuda
