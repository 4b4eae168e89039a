/* kitdispatch (NVRTC): <math.h>'s macros as glibc gives them (with _GNU_SOURCE, as g++ and so
   nvcc define it). NVRTC declares the math functions themselves. */
#ifndef KITDISPATCH_MATH_H
#define KITDISPATCH_MATH_H
#if __has_include(<cuda/std/__limits/numeric_limits.h>)
/* CCCL's <cuda/std/cmath> defines INFINITY and NAN under NVRTC: define them with the same
   tokens, so that a TU including both sees no conflicting redefinition. numeric_limits alone:
   <cuda/std/limits> would declare CCCL's int64_t and friends in the global namespace, which
   kernels written for NVRTC often typedef themselves. */
#include <cuda/std/__limits/numeric_limits.h>
#define INFINITY _CUDA_VSTD::numeric_limits<float>::infinity()
#define NAN _CUDA_VSTD::numeric_limits<float>::quiet_NaN()
#else
#define INFINITY (1.0f / 0.0f)
#define NAN (0.0f / 0.0f)
#endif
#define HUGE_VALF INFINITY
#define HUGE_VAL (1.0 / 0.0)
#define HUGE_VALL HUGE_VAL
#define FP_NAN 0
#define FP_INFINITE 1
#define FP_ZERO 2
#define FP_SUBNORMAL 3
#define FP_NORMAL 4
#define FP_ILOGB0 (-2147483647 - 1)
#define FP_ILOGBNAN (-2147483647 - 1)
#define MATH_ERRNO 1
#define MATH_ERREXCEPT 2
#define math_errhandling 0
#define M_E 2.7182818284590452354
#define M_LOG2E 1.4426950408889634074
#define M_LOG10E 0.43429448190325182765
#define M_LN2 0.69314718055994530942
#define M_LN10 2.30258509299404568402
#define M_PI 3.14159265358979323846
#define M_PI_2 1.57079632679489661923
#define M_PI_4 0.78539816339744830962
#define M_1_PI 0.31830988618379067154
#define M_2_PI 0.63661977236758134308
#define M_2_SQRTPI 1.12837916709551257390
#define M_SQRT2 1.41421356237309504880
#define M_SQRT1_2 0.70710678118654752440
typedef float float_t;
typedef double double_t;
#endif
