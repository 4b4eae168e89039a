// Kernels whose scalars are 64-bit, float and narrower types, described by inference
// (kitdispatch.toml gives only shapes, results and what C cannot say).
//
// IREE's CUDA HAL writes each push constant as 32 bits into its own kernel parameter, so a
// 64-bit scalar arrives as two 32-bit parameters NAME_lo, NAME_hi (low half first).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ inline long long join_i64(unsigned lo, unsigned hi) {
  return (long long)(((unsigned long long)hi << 32) | lo);
}
__device__ inline double join_f64(unsigned lo, unsigned hi) { return __longlong_as_double(join_i64(lo, hi)); }

// out = x + offset + big (big is a literal above 2^32 in the manifest)
extern "C" __global__ void add_i64(const long long* __restrict__ x, long long* __restrict__ out,
                                   unsigned offset_lo, unsigned offset_hi,
                                   unsigned big_lo, unsigned big_hi, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] + join_i64(offset_lo, offset_hi) + join_i64(big_lo, big_hi);
}

// out = x ^ mask ^ high (u64; high sets bits in both halves)
extern "C" __global__ void xor_u64(const long long* __restrict__ x, long long* __restrict__ out,
                                   unsigned mask_lo, unsigned mask_hi,
                                   unsigned high_lo, unsigned high_hi, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    unsigned long long m = (unsigned long long)join_i64(mask_lo, mask_hi) ^ (unsigned long long)join_i64(high_lo, high_hi);
    out[i] = (long long)((unsigned long long)x[i] ^ m);
  }
}

// out = x * a + b in double precision (a: an argument, b: the literal 0.1)
extern "C" __global__ void axpb_f64(const float* __restrict__ x, float* __restrict__ out,
                                    unsigned a_lo, unsigned a_hi, unsigned b_lo, unsigned b_hi, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = (float)((double)x[i] * join_f64(a_lo, a_hi) + join_f64(b_lo, b_hi));
}

// f16 tensors; an f16, a bf16 and a bool scalar (the low 16 / 8 bits of their parameter)
extern "C" __global__ void half_ops(const __half* __restrict__ x, __half* __restrict__ out,
                                    __half scale, __nv_bfloat16 bias, bool negate, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float v = __half2float(x[i]) * __half2float(scale) + __bfloat162float(bias);
    out[i] = __float2half(negate ? -v : v);
  }
}

// A C++ template (no extern "C"): the export uses its mangled name.
template <typename T>
__global__ void scale_t(T* __restrict__ out, const T* __restrict__ x, T a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i];
}
template __global__ void scale_t<float>(float*, const float*, float, int);
