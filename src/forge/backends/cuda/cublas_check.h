#pragma once
// FORGE_CUBLAS_CHECK(expr): a cuBLAS / cuBLASLt call whose status is not SUCCESS throws
// forge::Error naming the status, the call and the place. Internal to backends/cuda (it
// includes the cuBLAS headers).
#include <cublas_v2.h>

#include "forge/core/error.h"

namespace forge::cuda::detail {

[[noreturn]] inline void throw_cublas_error(cublasStatus_t st, const char* expr, const char* file, int line) {
  FORGE_THROW("cuBLAS error ", cublasGetStatusName(st), " (", cublasGetStatusString(st), ") in ", expr, " at ", file,
              ":", line);
}

}  // namespace forge::cuda::detail

#define FORGE_CUBLAS_CHECK(expr)                                                              \
  do {                                                                                        \
    const cublasStatus_t forge_cublas_st_ = (expr);                                           \
    if (forge_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                            \
      ::forge::cuda::detail::throw_cublas_error(forge_cublas_st_, #expr, __FILE__, __LINE__); \
  } while (0)
