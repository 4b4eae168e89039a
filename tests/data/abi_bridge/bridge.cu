// Kernels as people write them, unmodified: 64-bit scalars as one C parameter, scalars
// before pointers, const and __restrict__ qualifiers, a struct by value, fp8 and u64
// tensors, narrow integer scalars. kitdispatch bridges each entry to IREE's parameter
// passing (kitdispatch/bridge.py); the manifest gives only shapes and results.
#include <cuda_fp8.h>
#ifdef __CUDACC_RTC__  // NVRTC has no <cstdint>
typedef unsigned long uint64_t;
#else
#include <cstdint>
#endif

// Scalars before the pointers; a 64-bit offset (an argument) and a 64-bit literal.
extern "C" __global__ void add_i64(long long offset, const long long* __restrict__ x,
                                   long long* __restrict__ out, const long long big, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] + offset + big;
}

// u64 tensors, a uint64_t mask and a size_t count taken from the tensor's dimension.
extern "C" __global__ void xor_u64(const uint64_t* __restrict__ x, uint64_t* __restrict__ out,
                                   uint64_t mask, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] ^ mask;
}

// Doubles by value: an argument and a literal.
extern "C" __global__ void axpb_f64(double a, const double* __restrict__ x, double* __restrict__ out,
                                    double b, unsigned long long n) {
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + b;
}

// A plain struct by value (16 bytes: float, int, double), passed as four 32-bit constants.
struct Affine {
  float scale;
  int shift;
  double offset;
};
extern "C" __global__ void affine(const float* __restrict__ x, float* __restrict__ out, Affine p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = (float)((double)(x[i] * p.scale + (float)p.shift) + p.offset);
}

// Narrow integer scalars and const-qualified ones.
extern "C" __global__ void narrow(const int* __restrict__ x, int* __restrict__ out, const signed char s,
                                  const short t, const unsigned char u, const int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] * s + t + u;
}

// fp8 tensors: out = x * 2 in e4m3; e5m2 input widened to f32.
extern "C" __global__ void fp8_ops(const __nv_fp8_e4m3* __restrict__ x, const __nv_fp8_e5m2* __restrict__ y,
                                   __nv_fp8_e4m3* __restrict__ out, float* __restrict__ wide, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    out[i] = __nv_fp8_e4m3(2.0f * float(x[i]));
    wide[i] = float(y[i]);
  }
}
