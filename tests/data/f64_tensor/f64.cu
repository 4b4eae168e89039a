// out = x + 1e-12: an f64 tensor kernel. If IREE demoted the buffers to f32, the kernel would
// read garbage and the 1e-12 would be lost; `kitdispatch test` checks against float64.
extern "C" __global__ void add_tiny(const double* __restrict__ x, double* __restrict__ out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] + 1e-12;
}
