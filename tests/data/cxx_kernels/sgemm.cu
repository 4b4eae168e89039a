// C++ kernels as their authors write them, unmodified, for NVRTC and nvcc alike: templates
// with no explicit instantiation (the manifest names the instance), scalars before pointers,
// size_t and long scalars (bridged to IREE's parameter passing), a namespace.
#include <cstddef>

// SGEMM_CUDA's kernel 6 signature (siboehm/SGEMM_CUDA, src/kernels/6_kernel_vectorize.cuh)
// with a plain body: each block computes a BM x BN tile of C = alpha * A @ B + beta * C,
// each thread TM x TN of it, taking K in steps of BK.
template <const int BM, const int BN, const int BK, const int TM, const int TN>
__global__ void sgemmVectorize(int M, int N, int K, float alpha, float *A, float *B, float beta, float *C) {
  const uint cRow = blockIdx.y;
  const uint cCol = blockIdx.x;
  const int threadCol = threadIdx.x % (BN / TN);
  const int threadRow = threadIdx.x / (BN / TN);
  for (int i = 0; i < TM; ++i) {
    for (int j = 0; j < TN; ++j) {
      const int row = cRow * BM + threadRow * TM + i;
      const int col = cCol * BN + threadCol * TN + j;
      if (row >= M || col >= N) continue;
      float acc = 0.0f;
      for (int k0 = 0; k0 < K; k0 += BK) {
        for (int k = k0; k < k0 + BK && k < K; ++k) acc += A[row * K + k] * B[k * N + col];
      }
      C[row * N + col] = alpha * acc + beta * C[row * N + col];
    }
  }
}

namespace ops {
// A 64-bit count and a 64-bit offset before the pointers (both halves of the offset matter
// to `offset % 1000`), a type parameter.
template <typename T>
__global__ void shifted_axpy(size_t n, long offset, T a, const T *x, T *y) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + (T)(offset % 1000);
}
}  // namespace ops

// A template named with its arguments in the manifest.
template <typename T>
__global__ void fill(T *out, T v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = v;
}
