// The 1x1-convolution GEMM through cuBLASLt (see gemm1x1.h for the plan, gemm1x1_launch.h for the call).
#include <cublasLt.h>
#include <dlfcn.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/gemm1x1_launch.h"

namespace fastpipe::cuda {
namespace {

// The cuBLASLt entry points, from the library torch loaded for its own matmuls: linking it would make the
// whole extension fail to load on a machine whose CUDA libraries live elsewhere.
struct LtApi {
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  std::string missing;
};

// Only a copy this process has already loaded (RTLD_NOLOAD): the engine passes torch's cuBLASLt handle,
// which belongs to torch's copy and means nothing to a second one.
LtApi lookup(const std::string& soname) {
  LtApi a;
  void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (!lib) {
    a.missing = soname + " is not loaded in this process (torch loads it with its CUDA libraries); fastpipe does "
                "not load a second copy, which would not own torch's cuBLASLt handle";
    return a;
  }
  auto get = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (!fn && a.missing.empty()) a.missing = std::string(name) + " is not in " + soname;
  };
  get(a.desc_create, "cublasLtMatmulDescCreate");
  get(a.desc_destroy, "cublasLtMatmulDescDestroy");
  get(a.desc_set, "cublasLtMatmulDescSetAttribute");
  get(a.layout_create, "cublasLtMatrixLayoutCreate");
  get(a.layout_destroy, "cublasLtMatrixLayoutDestroy");
  get(a.pref_create, "cublasLtMatmulPreferenceCreate");
  get(a.pref_destroy, "cublasLtMatmulPreferenceDestroy");
  get(a.pref_set, "cublasLtMatmulPreferenceSetAttribute");
  get(a.heuristic, "cublasLtMatmulAlgoGetHeuristic");
  get(a.matmul, "cublasLtMatmul");
  return a;
}

const LtApi& lt() {
  static const LtApi api = lookup("libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR));
  return api;
}

cublasLtEpilogue_t lt_epilogue(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case LtEpilogue::Relu: return CUBLASLT_EPILOGUE_RELU;
    case LtEpilogue::ReluBias: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case LtEpilogue::Gelu: return CUBLASLT_EPILOGUE_GELU;
    case LtEpilogue::GeluBias: return CUBLASLT_EPILOGUE_GELU_BIAS;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

cudaDataType_t data_type(DType t) {
  switch (t) {
    case DType::Half: return CUDA_R_16F;
    case DType::BFloat16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

// The largest power of two (up to 256, cuBLASLt's default assumption) that divides the address.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align) align /= 2;
  return align;
}

// Destroys what the call created, on every path out.
struct Handles {
  const LtApi& api;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Handles() {
    if (pref) api.pref_destroy(pref);
    if (d) api.layout_destroy(d);
    if (b) api.layout_destroy(b);
    if (a) api.layout_destroy(a);
    if (desc) api.desc_destroy(desc);
  }
};

std::string failed(const char* call, cublasStatus_t s) {
  return std::string(call) + " failed with cuBLAS status " + std::to_string(static_cast<int>(s));
}

}  // namespace

std::string cublaslt_missing() {
  return lt().missing;
}

std::string cublaslt_missing_from(const std::string& soname) {
  return lookup(soname).missing;
}

std::string run_gemm1x1(const Gemm1x1Params& p, void* handle, cudaStream_t stream) {
  const LtApi& api = lt();
  if (!api.missing.empty()) return "unsupported: " + api.missing;
  const GemmPlan& g = p.plan;
  Handles h{api};
  const cublasComputeType_t compute =
      p.dtype == DType::Float && p.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cudaDataType_t dt = data_type(p.dtype);
  cublasStatus_t s = api.desc_create(&h.desc, compute, CUDA_R_32F);
  if (s != CUBLAS_STATUS_SUCCESS) return failed("cublasLtMatmulDescCreate", s);
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasLtEpilogue_t epi = lt_epilogue(g.epilogue);
  if ((s = api.desc_set(h.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta))) != CUBLAS_STATUS_SUCCESS ||
      (s = api.desc_set(h.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb))) != CUBLAS_STATUS_SUCCESS ||
      (s = api.desc_set(h.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi))) != CUBLAS_STATUS_SUCCESS)
    return failed("cublasLtMatmulDescSetAttribute", s);
  if (lt_epilogue_has_bias(g.epilogue)) {
    if (!p.bias) return "the plan has a bias but no bias pointer was given";
    s = api.desc_set(h.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias));
    if (s != CUBLAS_STATUS_SUCCESS) return failed("cublasLtMatmulDescSetAttribute(BIAS_POINTER)", s);
  }
  // Stored shapes: op(A) is m x k, so A is k x m when transposed; op(B) is k x n.
  if ((s = api.layout_create(&h.a, dt, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda)) != CUBLAS_STATUS_SUCCESS ||
      (s = api.layout_create(&h.b, dt, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb)) != CUBLAS_STATUS_SUCCESS ||
      (s = api.layout_create(&h.d, dt, g.m, g.n, g.ldd)) != CUBLAS_STATUS_SUCCESS)
    return failed("cublasLtMatrixLayoutCreate", s);
  if ((s = api.pref_create(&h.pref)) != CUBLAS_STATUS_SUCCESS) return failed("cublasLtMatmulPreferenceCreate", s);
  const uint64_t ws = p.workspace_bytes;
  const void* c = g.beta != 0.0f ? p.residual : p.out;
  const uint32_t align_a = alignment(p.weight), align_b = alignment(p.input), align_c = alignment(c),
                 align_d = alignment(p.out);
  if ((s = api.pref_set(h.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws))) != CUBLAS_STATUS_SUCCESS ||
      (s = api.pref_set(h.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a))) !=
          CUBLAS_STATUS_SUCCESS ||
      (s = api.pref_set(h.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b))) !=
          CUBLAS_STATUS_SUCCESS ||
      (s = api.pref_set(h.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c))) !=
          CUBLAS_STATUS_SUCCESS ||
      (s = api.pref_set(h.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d))) !=
          CUBLAS_STATUS_SUCCESS)
    return failed("cublasLtMatmulPreferenceSetAttribute", s);
  auto* lt_handle = static_cast<cublasLtHandle_t>(handle);
  cublasLtMatmulHeuristicResult_t best{};
  int found = 0;
  s = api.heuristic(lt_handle, h.desc, h.a, h.b, h.d, h.d, h.pref, 1, &best, &found);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || (s == CUBLAS_STATUS_SUCCESS && found == 0))
    return "unsupported: cuBLASLt has no algorithm for these operands and epilogue";
  if (s != CUBLAS_STATUS_SUCCESS) return failed("cublasLtMatmulAlgoGetHeuristic", s);
  const float alpha = 1.0f, beta = g.beta;
  s = api.matmul(lt_handle, h.desc, &alpha, p.weight, h.a, p.input, h.b, &beta, c, h.d, p.out, h.d, &best.algo,
                 p.workspace, p.workspace_bytes, stream);
  return s == CUBLAS_STATUS_SUCCESS ? std::string() : failed("cublasLtMatmul", s);
}

}  // namespace fastpipe::cuda
