#include "cuda/gemm_lt.hpp"

#include <cstdint>
#include <cstdio>
#include <string>

#include "cuda/conv.hpp"
#include "cuda/cuda_check.hpp"
#include "model/kernel_trace.hpp"

namespace ddp::cuda {

namespace {
// cuBLAS's advice for Hopper's kernels; PyTorch gives cuBLASLt as much there.
constexpr std::size_t kWorkspaceBytes = std::size_t(32) << 20;
// The bias's room, after the workspace (cudaMalloc's alignment kept): the bias
// narrowed to C's type beside a narrow C, or an fp32 bias copied there where it lies
// off 16 bytes (a slice of the packed parameters may; kernels the heuristics pick may
// assume 16 and fault on a misaligned address, which the heuristics are not told of:
// PyTorch falls back to an unfused addmm there). GPT-2's widest bias is 4 d = 3072.
constexpr int kBiasRoomElements = 1 << 16;

cublasLtEpilogue_t lt_epilogue(CublasLtGemm::Epilogue e) {
  switch (e) {
    case CublasLtGemm::Epilogue::none:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case CublasLtGemm::Epilogue::bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case CublasLtGemm::Epilogue::gelu:
      return CUBLASLT_EPILOGUE_GELU_AUX;
    case CublasLtGemm::Epilogue::gelu_bias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case CublasLtGemm::Epilogue::dgelu:
      return CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The attributes' declared types (cublasLt.h), as the sizes handed over assume.
static_assert(sizeof(cublasOperation_t) == sizeof(std::int32_t) &&
                  sizeof(cublasLtEpilogue_t) == sizeof(std::uint32_t) &&
                  sizeof(cudaDataType_t) == sizeof(std::int32_t) &&
                  sizeof(std::size_t) == sizeof(std::uint64_t),
              "cuBLASLt attribute sizes");

bool has_bias(CublasLtGemm::Epilogue e) {
  return e == CublasLtGemm::Epilogue::bias || e == CublasLtGemm::Epilogue::gelu_bias;
}

// The largest power of two up to 256 dividing the address (256 for none): the
// heuristics are told it (their default assumes 256), and it is part of a plan's key.
int alignment_of(const void* p) {
  const std::uintptr_t bits = reinterpret_cast<std::uintptr_t>(p) | 256;
  return int(bits & (~bits + 1));
}

// A refusal cuBLASLt makes before it launches anything: the call may fall back.
bool refused(cublasStatus_t rc) {
  return rc == CUBLAS_STATUS_NOT_SUPPORTED || rc == CUBLAS_STATUS_INVALID_VALUE ||
         rc == CUBLAS_STATUS_ARCH_MISMATCH;
}

// Whether the bias goes in through the room: narrowed beside a narrow C, or an fp32
// bias copied there where it lies off 16 bytes.
bool bias_in_room(CublasLtGemm::Epilogue e, DType c_type, const float* bias) {
  return has_bias(e) && (c_type != DType::F32 || alignment_of(bias) < 16);
}

const char* epilogue_name(CublasLtGemm::Epilogue e) {
  switch (e) {
    case CublasLtGemm::Epilogue::none:
      return "none";
    case CublasLtGemm::Epilogue::bias:
      return "bias";
    case CublasLtGemm::Epilogue::gelu:
      return "gelu_aux";
    case CublasLtGemm::Epilogue::gelu_bias:
      return "gelu_aux_bias";
    case CublasLtGemm::Epilogue::dgelu:
      return "dgelu";
  }
  return "?";
}
}  // namespace

// DDP_CUBLASLT_LOG=1: one line per key (shape, types, epilogue, alignments) when its
// first call runs on cuBLASLt or is declined, with why, each rank's own.
void CublasLtGemm::log_key(const Key& key, const char* outcome) const {
  static const bool on = env_flag("DDP_CUBLASLT_LOG");
  if (!on) return;
  const Shape& s = std::get<0>(key);
  std::fprintf(
      stderr,
      "cuBLASLt gemm %c%c m %d n %d k %d ld %d/%d/%d %s->%s epilogue %s%s align a %d b %d c %d bias %d "
      "aux %d add %d: %s\n",
      std::get<0>(s) ? 'T' : 'N', std::get<1>(s) ? 'T' : 'N', std::get<2>(s), std::get<3>(s), std::get<4>(s),
      std::get<5>(s), std::get<6>(s), std::get<7>(s),
      std::get<11>(s) ? "tf32" : dtype_name(DType(std::get<8>(s))), dtype_name(DType(std::get<9>(s))),
      epilogue_name(Epilogue(std::get<10>(s))), std::get<12>(s) ? "+add" : "", std::get<2>(key),
      std::get<1>(key), std::get<3>(key), std::get<4>(key), std::get<5>(key), std::get<6>(key), outcome);
}

// A plan's descriptors (host objects, no device work), made once.
struct CublasLtGemm::Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

CublasLtGemm::CublasLtGemm(cudaStream_t stream) : stream_(stream) {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
  CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes + std::size_t(kBiasRoomElements) * sizeof(float)));
}

CublasLtGemm::~CublasLtGemm() {
  plans_.clear();  // the descriptors before the handle
  if (workspace_) {
    cudaStreamSynchronize(stream_);
    cudaFree(workspace_);
  }
  if (handle_) cublasLtDestroy(handle_);
}

CublasLtGemm::Shape CublasLtGemm::shape_of(bool trans_a, bool trans_b, int m, int n, int k, int lda, int ldb,
                                           int ldc, DType ab, DType c_type, Epilogue epilogue,
                                           bool add) const {
  return Shape{trans_a,
               trans_b,
               m,
               n,
               k,
               lda,
               ldb,
               ldc,
               int(ab),
               int(c_type),
               int(epilogue),
               tf32_ && ab == DType::F32,
               add};
}

bool CublasLtGemm::declines(bool trans_a, bool trans_b, int m, int n, int k, int lda, int ldb, int ldc,
                            DType ab, DType c_type, Epilogue epilogue, bool add, const float* bias) const {
  const Shape shape = shape_of(trans_a, trans_b, m, n, k, lda, ldb, ldc, ab, c_type, epilogue, add);
  // The GELU's input lies as C does; cuBLASLt wants its leading dimension a multiple of 8.
  const bool gelu = epilogue != Epilogue::none && epilogue != Epilogue::bias;
  const bool room = bias_in_room(epilogue, c_type, bias);
  const char* why = k == 0                 ? "k 0"
                    : gelu && ldc % 8 != 0 ? "the GELU's input's leading dimension not a multiple of 8"
                    : add && gelu          ? "a residual with a GELU"
                    : room && n > kBiasRoomElements ? "a bias wider than its room"
                                                    : nullptr;
  if (why == nullptr) return declined_.count(shape) > 0;
  static const bool log = env_flag("DDP_CUBLASLT_LOG");
  if (log && logged_declines_.insert(shape).second)
    log_key(Key{shape, 0, 0, 0, 0, 0, 0},
            (std::string("declined before cuBLASLt is asked (") + why + ")").c_str());
  return true;
}

bool CublasLtGemm::operator()(bool trans_a, bool trans_b, int m, int n, int k, const void* a, int lda,
                              const void* b, int ldb, void* c, int ldc, DType ab, DType c_type,
                              Epilogue epilogue, const float* bias, void* aux, const void* add) {
  DDP_REQUIRE(c_type == DType::F32 || c_type == ab,
              "cuBLASLt GEMM: C of " << dtype_name(c_type) << " with " << dtype_name(ab) << " operands");
  DDP_REQUIRE(has_bias(epilogue) == (bias != nullptr), "cuBLASLt GEMM: a bias where the epilogue has none");
  if (declines(trans_a, trans_b, m, n, k, lda, ldb, ldc, ab, c_type, epilogue, add, bias)) return false;
  const Shape shape = shape_of(trans_a, trans_b, m, n, k, lda, ldb, ldc, ab, c_type, epilogue, add);
  const bool gelu = epilogue != Epilogue::none && epilogue != Epilogue::bias,
             narrow_bias = has_bias(epilogue) && c_type != DType::F32,
             moved_bias = bias_in_room(epilogue, c_type, bias) && !narrow_bias;
  void* bias_room = static_cast<char*>(workspace_) + kWorkspaceBytes;
  const void* bias_given = bias_in_room(epilogue, c_type, bias) ? bias_room : static_cast<const void*>(bias);
  const Key key{shape,
                alignment_of(b),
                alignment_of(a),
                alignment_of(c),
                alignment_of(bias_given),
                alignment_of(aux),
                alignment_of(add)};

  if (declined_keys_.count(key)) return false;
  auto found = plans_.find(key);
  if (found == plans_.end()) {
    // cuBLASLt is column-major: a row-major (m, n) C is a column-major (n, m) C^T =
    // op(B)^T op(A)^T, so B is its A and A its B, each keeping its transpose; C's rows
    // there are our columns, so the bias (n) is a value per row of its D, as it wants.
    Plan plan;
    plan.d = std::make_unique<Descriptors>();
    Descriptors& d = *plan.d;
    const bool fast = std::get<11>(shape);
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, fast ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                                          CUDA_R_32F));
    const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                            op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    const cublasLtEpilogue_t lt = lt_epilogue(epilogue);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &lt, sizeof(lt)));
    if (has_bias(epilogue)) {
      const cudaDataType_t type = narrow_bias ? cuda_type(c_type) : CUDA_R_32F;
      CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof(type)));
    }
    if (gelu) {
      const std::int64_t aux_ld = ldc;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                  sizeof(aux_ld)));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, cuda_type(ab), trans_b ? k : n, trans_b ? n : k, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, cuda_type(ab), trans_a ? m : k, trans_a ? k : m, lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, cuda_type(c_type), n, m, ldc));
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.preference));
    const std::size_t workspace_bytes = kWorkspaceBytes;
    const std::uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    const std::uint32_t align_a = std::get<1>(key), align_b = std::get<2>(key), align_d = std::get<3>(key),
                        align_c = add ? std::uint32_t(std::get<6>(key)) : align_d;
    const std::pair<cublasLtMatmulPreferenceAttributes_t, const void*> preferences[] = {
        {CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes},
        {CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d}};
    for (const auto& [attribute, value] : preferences)
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.preference, attribute, value,
                                                        attribute == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
                                                            ? sizeof(std::size_t)
                                                            : sizeof(std::uint32_t)));
    found = plans_.emplace(key, std::move(plan)).first;
  }
  Plan& plan = found->second;
  Descriptors& d = *plan.d;
  // The pointers, each call's own (the heuristics read their values for alignment).
  if (has_bias(epilogue))
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_given,
                                                sizeof(bias_given)));
  if (gelu)
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  // A shape no alignment of which has run is declined as a whole (declines() says so
  // before the caller converts operands); one that has run keeps its proven keys, so
  // a run never changes path partway, and declines this key alone.
  const auto decline = [&](const char* why) {
    log_key(key, why);
    plans_.erase(found);
    bool shape_ran = false;
    for (const auto& [other, other_plan] : plans_)
      shape_ran |= std::get<0>(other) == shape && other_plan.proven;
    if (shape_ran)
      declined_keys_.insert(key);
    else
      declined_.insert(shape);
    return false;
  };
  if (!plan.proven) {  // first call of this key: the heuristics' first choice, or none
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    const cublasStatus_t rc =
        cublasLtMatmulAlgoGetHeuristic(handle_, d.op, d.a, d.b, d.c, d.c, d.preference, 1, &result, &count);
    if (rc != CUBLAS_STATUS_SUCCESS && !refused(rc)) CUBLAS_CHECK(rc);
    if (rc != CUBLAS_STATUS_SUCCESS) return decline("declined (the heuristics refused the descriptors)");
    if (count == 0 || result.state != CUBLAS_STATUS_SUCCESS)
      return decline("declined (the heuristics offered no algorithm)");
    plan.algo = result.algo;
  }
  if (narrow_bias) convert_from_f32(bias, bias_room, c_type, std::size_t(n), stream_);
  if (moved_bias) {
    const auto launch = kernel_trace::cuda_launch("copy bias to 16 bytes", "fp32");
    CUDA_CHECK(
        cudaMemcpyAsync(bias_room, bias, std::size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  }

  const kernel_trace::Timed timed("cuBLASLt gemm epilogue", std::get<11>(shape) ? "tf32" : dtype_name(ab));
  // The residual is cuBLASLt's C, added at beta 1 (its layout D's); without one C is D, not read.
  const float alpha = 1.0f, beta = add ? 1.0f : 0.0f;
  const void* c_in = add ? add : c;
  const cublasStatus_t rc = cublasLtMatmul(handle_, d.op, &alpha, b, d.a, a, d.b, &beta, c_in, d.c, c, d.c,
                                           &plan.algo, workspace_, kWorkspaceBytes, stream_);
  // Refused at its first call (an argument the heuristics passed and the kernels do
  // not take), checked before anything of its own is queued: the fallback runs. The
  // bias's conversion before it only wrote the room it owns.
  if (!plan.proven && refused(rc)) return decline("declined (refused at its first call)");
  CUBLAS_CHECK(rc);
  if (!plan.proven) log_key(key, "runs on cuBLASLt");
  plan.proven = true;
  return true;
}

}  // namespace ddp::cuda
