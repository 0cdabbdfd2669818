// cuBLASLt GEMM runner: argument checks, the row-major -> column-major
// mapping, plan cache, epilogue fusion with a kernel fallback (gemm.h).
#include "kernels/cuda/gemm.h"

#include <string>

#include "tiers/cuda_check.h"

namespace strata::kernels::cuda {

Status CublasStatus(cublasStatus_t st, const char* expr, const char* file, int line) {
  Status::Rep rep;
  rep.code = st == CUBLAS_STATUS_ALLOC_FAILED ? StatusCode::kOutOfMemory : StatusCode::kCudaError;
  if (rep.code == StatusCode::kOutOfMemory) rep.tier = TierKind::kGpu;
  rep.message = std::string(cublasLtGetStatusName(st)) + " (" + cublasLtGetStatusString(st) +
                ") in " + expr + " at " + file + ":" + std::to_string(line);
  return Status(std::move(rep));
}

namespace {

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

bool IsStorageFloat(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// Largest power of two <= 16 that divides the address (16 for null).
int64_t AlignOf(const void* p) {
  uintptr_t u = reinterpret_cast<uintptr_t>(p);
  if (u == 0) return 16;
  int64_t a = 1;
  while (a < 16 && (u & static_cast<uintptr_t>(a)) == 0) a <<= 1;
  return a;
}
// Alignment of every batch item of a matrix: the base's and the stride's.
int64_t BatchAlign(const void* p, int batch, int64_t stride, size_t es) {
  int64_t a = AlignOf(p);
  if (batch > 1 && stride != 0) {
    int64_t s = AlignOf(reinterpret_cast<const void*>(static_cast<uintptr_t>(stride * es)));
    a = std::min(a, s);
  }
  return a;
}

std::string Dims(const GemmArgs& g) {
  return "m " + std::to_string(g.m) + ", n " + std::to_string(g.n) + ", k " + std::to_string(g.k) +
         ", lda " + std::to_string(g.lda) + ", ldb " + std::to_string(g.ldb) + ", ldc " +
         std::to_string(g.ldc) + (g.trans_a ? ", A^T" : "") + (g.trans_b ? ", B^T" : "") +
         ", batch " + std::to_string(g.batch) + ", " + std::string(DTypeName(g.ab_dtype)) + " -> " +
         std::string(DTypeName(g.c_dtype));
}

Status CheckGemm(const GemmArgs& g) {
  auto bad = [&](const std::string& what) { return InvalidArgument("Gemm: " + what + " (" + Dims(g) + ")"); };
  if (g.m < 0 || g.n < 0 || g.k < 0) return bad("m, n and k must be >= 0");
  if (g.batch < 0) return bad("batch must be >= 0");
  if (!IsStorageFloat(g.ab_dtype)) return bad("ab_dtype must be f32, f16 or bf16");
  if (g.c_dtype != DType::kF32 && g.c_dtype != g.ab_dtype)
    return bad("c_dtype must be f32 or ab_dtype");
  const int64_t a_cols = g.trans_a ? g.m : g.k;
  const int64_t b_cols = g.trans_b ? g.k : g.n;
  if (g.lda < std::max<int64_t>(1, a_cols)) return bad("lda too small for A's row length");
  if (g.ldb < std::max<int64_t>(1, b_cols)) return bad("ldb too small for B's row length");
  if (g.ldc < std::max<int64_t>(1, g.n)) return bad("ldc must be >= n");
  if (g.gelu_aux && !g.gelu) return bad("gelu_aux given without gelu");
  if (g.m > 0 && g.n > 0 && g.batch > 0) {
    if (!g.c) return bad("c is null");
    if (g.k > 0 && (!g.a || !g.b)) return bad("a or b is null");
    if (g.batch > 1) {
      if (g.stride_a < 0 || g.stride_b < 0) return bad("negative batch stride");
      if (g.stride_c < (g.m - 1) * g.ldc + g.n) return bad("stride_c makes batch outputs overlap");
    }
    if (g.gelu_aux == g.c) return bad("gelu_aux must not alias c");
  }
  return Status::OK();
}

template <typename V>
cublasStatus_t SetDesc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  return cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v));
}
template <typename V>
cublasStatus_t SetLayout(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const V& v) {
  return cublasLtMatrixLayoutSetAttribute(l, attr, &v, sizeof(v));
}

}  // namespace

GemmRunner::Plan::~Plan() {
  if (a) cublasLtMatrixLayoutDestroy(a);
  if (b) cublasLtMatrixLayoutDestroy(b);
  if (c) cublasLtMatrixLayoutDestroy(c);
  if (desc) cublasLtMatmulDescDestroy(desc);
}

Result<std::unique_ptr<GemmRunner>> GemmRunner::Make(cudaStream_t stream, const GemmOptions& opts) {
  std::unique_ptr<GemmRunner> r(new GemmRunner(stream, opts));
  CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&r->handle_));
  if (opts.workspace_bytes > 0) CUDA_RETURN_IF_ERROR(cudaMalloc(&r->workspace_, opts.workspace_bytes));
  return r;
}

GemmRunner::~GemmRunner() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

Result<GemmRunner::Plan*> GemmRunner::GetPlan(const GemmArgs& g, int epi) {
  const size_t ab_es = DTypeSize(g.ab_dtype), c_es = DTypeSize(g.c_dtype);
  const bool fused = epi != CUBLASLT_EPILOGUE_DEFAULT;
  const int64_t align_a = BatchAlign(g.a, g.batch, g.stride_a, ab_es);
  const int64_t align_b = BatchAlign(g.b, g.batch, g.stride_b, ab_es);
  const int64_t align_c = BatchAlign(g.c, g.batch, g.stride_c, c_es);
  const int64_t align_bias = fused && g.bias ? AlignOf(g.bias) : 0;
  const int64_t align_aux = fused && g.gelu_aux ? AlignOf(g.gelu_aux) : 0;
  Key key = {g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldc,
             static_cast<int64_t>(g.ab_dtype), static_cast<int64_t>(g.c_dtype), g.batch,
             g.batch > 1 ? g.stride_a : 0, g.batch > 1 ? g.stride_b : 0,
             g.batch > 1 ? g.stride_c : 0, epi, align_a, align_b, align_c, align_bias, align_aux};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();

  auto plan = std::make_unique<Plan>();
  const cublasComputeType_t compute = (g.ab_dtype == DType::kF32 && opts_.tf32)
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan->desc, compute, CUDA_R_32F));
  // cuBLAS's A is our B and its B is our A (see gemm.h).
  const int32_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_RETURN_IF_ERROR(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a));
  CUBLAS_RETURN_IF_ERROR(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b));
  if (fused) {
    const uint32_t e = static_cast<uint32_t>(epi);
    CUBLAS_RETURN_IF_ERROR(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, e));
    if (g.bias) {
      const int32_t bt = CudaType(g.ab_dtype);
      CUBLAS_RETURN_IF_ERROR(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bt));
      CUBLAS_RETURN_IF_ERROR(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias));
    }
    if (g.gelu_aux) {
      const int64_t ld = g.ldc;
      CUBLAS_RETURN_IF_ERROR(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.gelu_aux));
      CUBLAS_RETURN_IF_ERROR(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ld));
    }
  }
  const cudaDataType_t ab_t = CudaType(g.ab_dtype), c_t = CudaType(g.c_dtype);
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->a, ab_t, g.trans_b ? g.k : g.n,
                                                    g.trans_b ? g.n : g.k, g.ldb));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->b, ab_t, g.trans_a ? g.m : g.k,
                                                    g.trans_a ? g.k : g.m, g.lda));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->c, c_t, g.n, g.m, g.ldc));
  if (g.batch > 1) {
    const int32_t count = g.batch;
    CUBLAS_RETURN_IF_ERROR(SetLayout(plan->a, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, count));
    CUBLAS_RETURN_IF_ERROR(SetLayout(plan->b, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, count));
    CUBLAS_RETURN_IF_ERROR(SetLayout(plan->c, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, count));
    CUBLAS_RETURN_IF_ERROR(SetLayout(plan->a, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, g.stride_b));
    CUBLAS_RETURN_IF_ERROR(SetLayout(plan->b, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, g.stride_a));
    CUBLAS_RETURN_IF_ERROR(SetLayout(plan->c, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, g.stride_c));
  }

  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = opts_.workspace_bytes;
  const uint32_t al_a = static_cast<uint32_t>(align_b), al_b = static_cast<uint32_t>(align_a),
                 al_c = static_cast<uint32_t>(align_c);
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c);
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b,
                                                       plan->c, plan->c, pref, 1, &result, &returned);
    // NOT_SUPPORTED means "no algorithm for this case": the caller falls back.
    if (hs != CUBLAS_STATUS_SUCCESS && hs != CUBLAS_STATUS_NOT_SUPPORTED) st = hs;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  CUBLAS_RETURN_IF_ERROR(st);
  if (returned > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    plan->algo = result.algo;
    plan->has_algo = true;
  }
  Plan* p = plan.get();
  plans_.emplace(key, std::move(plan));
  return p;
}

Status GemmRunner::Run(const GemmArgs& g) {
  RETURN_IF_ERROR(CheckGemm(g));
  if (g.m == 0 || g.n == 0 || g.batch == 0) return Status::OK();
  const bool want_epi = g.bias != nullptr || g.gelu;
  if (g.k == 0)  // C = beta * C (+ bias, GELU); beta = 0 never reads C
    return GemmEpilogue(stream_, g.c, g.c_dtype, g.ldc, g.m, g.n, g.batch, g.stride_c, g.beta,
                        g.beta == 0.f, g.bias, g.ab_dtype, g.gelu, g.gelu_aux);

  int epi = CUBLASLT_EPILOGUE_DEFAULT;
  if (want_epi && opts_.epilogues && g.c_dtype == g.ab_dtype && g.batch == 1 &&
      (!g.gelu_aux || g.ldc % 8 == 0)) {
    if (g.bias)
      epi = !g.gelu ? CUBLASLT_EPILOGUE_BIAS
                    : (g.gelu_aux ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS);
    else
      epi = g.gelu_aux ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU;
  }
  ASSIGN_OR_RETURN(Plan * plan, GetPlan(g, epi));
  if (epi != CUBLASLT_EPILOGUE_DEFAULT && !plan->has_algo) {
    epi = CUBLASLT_EPILOGUE_DEFAULT;
    ASSIGN_OR_RETURN(plan, GetPlan(g, epi));
  }
  if (!plan->has_algo)
    return Unavailable("Gemm: cuBLASLt offers no algorithm for " + Dims(g));
  const bool fused = epi != CUBLASLT_EPILOGUE_DEFAULT;
  if (fused) {  // the cached descriptor holds the pointers of the call that made it
    if (g.bias) CUBLAS_RETURN_IF_ERROR(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias));
    if (g.gelu_aux)
      CUBLAS_RETURN_IF_ERROR(SetDesc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.gelu_aux));
  }
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle_, plan->desc, &g.alpha, g.b, plan->a, g.a, plan->b,
                                        &g.beta, g.c, plan->c, g.c, plan->c, &plan->algo,
                                        workspace_, opts_.workspace_bytes, stream_));
  if (want_epi && !fused)
    return GemmEpilogue(stream_, g.c, g.c_dtype, g.ldc, g.m, g.n, g.batch, g.stride_c, 1.f, false,
                        g.bias, g.ab_dtype, g.gelu, g.gelu_aux);
  return Status::OK();
}

}  // namespace strata::kernels::cuda
