// FASTPIPE_HD marks functions compiled for the host and the device (the per-element code the CPU tests
// execute); plain inline functions outside nvcc.
#pragma once

#if defined(__CUDACC__)
#define FASTPIPE_HD __host__ __device__
#else
#define FASTPIPE_HD
#endif
