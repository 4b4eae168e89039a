// The two kernels of IREE's CUDA custom-dispatch sample, described in kitdispatch.toml.
//
// IREE passes every buffer first (in the layout's binding order), then every push
// constant, so the C signature lists the pointers before the scalars.

// out = lhs * rhs
extern "C" __global__ void simple_mul(const float* __restrict__ lhs,
                                      const float* __restrict__ rhs,
                                      float* __restrict__ out, int n) {
  int i = blockDim.x * blockIdx.x + threadIdx.x;
  if (i < n) {
    out[i] = lhs[i] * rhs[i];
  }
}

// rhs *= lhs, in place
extern "C" __global__ void simple_mul_inplace(const float* __restrict__ lhs,
                                              float* __restrict__ rhs, int n) {
  int i = blockDim.x * blockIdx.x + threadIdx.x;
  if (i < n) {
    rhs[i] *= lhs[i];
  }
}
