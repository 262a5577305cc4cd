// The cuBLASLt call of the 1x1-convolution GEMM (gemm1x1.h has the plan). cuBLASLt is looked up at run time
// in the library torch has loaded, so the extension does not link it and loads where it is missing; where
// torch has not loaded it the engine declines (it never loads a copy of its own).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "cuda/epilogue.h"
#include "kernels/gemm1x1.h"

namespace fastpipe::cuda {

struct Gemm1x1Params {
  GemmPlan plan;
  const void* weight = nullptr;    // A
  const void* input = nullptr;     // B
  const void* residual = nullptr;  // C, when plan.beta != 0
  const void* bias = nullptr;      // when the plan's epilogue has one
  void* out = nullptr;             // D
  DType dtype = DType::Float;      // of every operand; accumulation is float32
  bool tf32 = false;               // float32 inputs may be rounded to TF32 (torch's conv setting)
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Why cuBLASLt cannot be used in this process (empty when it can).
std::string cublaslt_missing();
// The same lookup in the library `soname` (a test hook: a library the process has not loaded is declined).
std::string cublaslt_missing_from(const std::string& soname);

// Queues the GEMM on `stream` with `handle` (a cublasLtHandle_t). Returns "" or what failed: no algorithm
// for these operands ("unsupported: ..."), or the failing cuBLASLt call and its status.
std::string run_gemm1x1(const Gemm1x1Params& p, void* handle, cudaStream_t stream);

}  // namespace fastpipe::cuda
