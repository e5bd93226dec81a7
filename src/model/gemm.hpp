#pragma once
// The one GEMM of the code base. Row-major, raw pointers in Kokkos's default memory
// space: the process's compute backend (model/backend.hpp) runs it, oneDNN on the
// host or cuBLAS on the rank's stream.

#include <cstdint>

#include "model/precision.hpp"

namespace ddp {

// C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C, all row-major.
// op(A) = A^T when trans_a (A is then stored (k, m)); likewise for B.
// `precision`: the operands A and B are rounded to it, the products accumulate in
// fp32 and C stays fp32 (src/model/precision.hpp).
void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc, Precision precision = Precision::fp32);

// `batch` GEMMs of one shape: C_i (m, n) = alpha op(A_i) op(B_i) + beta C_i with
// A_i = a + i stride_a, B_i = b + i stride_b, C_i = c + i stride_c (in floats); the
// C_i must not overlap. One library call where the backend has one (cuBLAS).
void gemm_batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                  std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b, float beta, float* c,
                  int ldc, std::int64_t stride_c, int batch, Precision precision = Precision::fp32);

// How a GEMM's operands and result lie in memory (Tensor::type): fp32, or narrow, two
// elements to a float, as a narrow tensor holds them (model/elements.hpp). A narrow
// operand is of the GEMM's operand type (its precision) and is read as it is, no
// copy narrowing it first; a narrow C is written rounded to that type, with beta 0
// (it is not read). Leading dimensions count elements of each one's type. The
// transformer blocks keep their inner activations so where the model keeps
// activations narrow (TransformerBlock::set_types), as PyTorch's AMP does.
struct GemmStored {
  Precision a = Precision::fp32, b = Precision::fp32, c = Precision::fp32;
  bool narrow() const { return a != Precision::fp32 || b != Precision::fp32 || c != Precision::fp32; }
};

// gemm on operands and a result stored as `stored` says. Where the backend reads and
// writes narrow ones itself (cuBLAS: ComputeBackend::gemm_stored), one call on them;
// elsewhere (the host) the narrow ones widened into fp32 scratch first (exact: a
// narrow value is a float), C narrowed from it after.
void gemm_stored(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a, int lda,
                 const void* b, int ldb, float beta, void* c, int ldc, Precision precision,
                 GemmStored stored);

// What a GEMM does to each element of its product before storing it: a layer's
// bias, activation or activation's gradient in the GEMM's own pass over C, as
// cuBLASLt's epilogues do them (STYLE: bias and activation in the GEMM's epilogue).
// A narrow C is then rounded once, after them, and no kernel passes over C again.
//   none:  C = P + bias              (P = op(A) op(B); bias (n) added to every row, or null)
//   relu:  C = relu(P + bias)        (NaN kept, as model/select.hpp's relu_passes)
//   gelu:  pre = P + bias, C = gelu(pre): `pre` (m, ldc) of C's type, the GELU's input,
//          which backward reads
//   dgelu: C = P gelu'(pre): the GELU's backward in the GEMM that makes its output
//          gradient, `pre` read as gelu stored it; no bias
// `tanh`: the GELU's tanh form (GPT-2's), else the exact one (model/gelu_math.hpp).
// `add` (m, ldc) fp32, with none and an fp32 C: C = add + (P + bias), a residual sum
// (a transformer block's r = x + attention(a), y = r + mlp(c)) in the same pass.
struct GemmEpilogue {
  enum class Act { none, relu, gelu, dgelu };
  const float* bias = nullptr;
  Act act = Act::none;
  bool tanh = false;
  void* pre = nullptr;
  const float* add = nullptr;
};

// C = epilogue(op(A) op(B)), operands and C stored as `stored` says (alpha 1, beta 0:
// C is written, not added to). One library call where the backend has the epilogue
// for these arguments (ComputeBackend::gemm_epilogue: cuBLASLt's, bias, residual, tanh
// GELU and its gradient); elsewhere gemm_stored and then one pass over C doing all of it (on
// the host a narrow C is made in fp32 scratch and rounded once by that pass).
void gemm_epilogue(bool trans_a, bool trans_b, int m, int n, int k, const void* a, int lda, const void* b,
                   int ldb, void* c, int ldc, Precision precision, GemmStored stored,
                   const GemmEpilogue& epilogue);

// The steps between a batch's operands, in floats: A, B and C.
struct GemmSteps {
  std::int64_t a, b, c;
};

// groups x batch GEMMs of one shape: the i-th of group g takes A at a + g group.a +
// i item.a, B and C likewise; no two C overlap. Attention's per-head products over a
// batch of samples: the heads' step is a few columns, the samples' a few rows of qkv,
// which no single stride spans (ComputeBackend::gemm_batched_groups).
void gemm_batched_groups(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                         int lda, const float* b, int ldb, float beta, float* c, int ldc, int batch,
                         GemmSteps item, int groups, GemmSteps group, Precision precision = Precision::fp32);

}  // namespace ddp
