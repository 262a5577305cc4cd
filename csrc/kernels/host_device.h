// FASTPIPE_HD marks functions compiled for the host and the device (the per-element code the CPU tests
// execute); plain inline functions outside nvcc. FASTPIPE_UNROLL unrolls a loop of constant trip count
// in device code (keeping arrays it indexes in registers); nothing on the host.
#pragma once

#if defined(__CUDACC__)
#define FASTPIPE_HD __host__ __device__
#else
#define FASTPIPE_HD
#endif

#if defined(__CUDA_ARCH__)
#define FASTPIPE_UNROLL _Pragma("unroll")
#else
#define FASTPIPE_UNROLL
#endif
