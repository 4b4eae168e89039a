/* kitdispatch: pre-included in every NVRTC compile. What nvcc's implicit cuda_runtime.h makes
   visible without an include (glibc's math.h, limits.h, sys/types.h); see README.md here. */
#ifndef KITDISPATCH_NVRTC_PRELUDE_H
#define KITDISPATCH_NVRTC_PRELUDE_H
#ifdef __CUDACC_RTC__
#include <math.h>
#include <limits.h>
#include <sys/types.h>
#endif
#endif
