#pragma once
// Portability macros shared by host and device code.

#if defined(__CUDACC__) || defined(__HIPCC__)
#define FORGE_HD __host__ __device__
#define FORGE_HD_INLINE __host__ __device__ __forceinline__
#else
#define FORGE_HD
#define FORGE_HD_INLINE inline
#endif
