// Writes the __CUDA_ARCH__ the running code was compiled for (e.g. 900 for sm_90), so a
// test can tell which variant or object the runtime picked.
extern "C" __global__ void arch_probe(int* __restrict__ out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
#ifdef __CUDA_ARCH__
    out[i] = __CUDA_ARCH__;
#else
    out[i] = -1;
#endif
  }
}
