// Kernels that `kitdispatch test` can check only with [test] ranges and tolerances.

// out[i][j] = table[idx[i]][j]: an embedding lookup; idx must hold valid rows of the table.
extern "C" __global__ void gather_rows(const int* idx, const float* table, float* out, int n, int v, int d) {
  int i = blockIdx.y;
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && j < d) {
    int row = idx[i];
    out[i * d + j] = (row >= 0 && row < v) ? table[row * d + j] : __int_as_float(0x7fc00000);  // NaN: a bad index
  }
}

// out[0] = sum of x, by one block of 256 threads: another float order than numpy's.
extern "C" __global__ void total(const float* x, float* out, int m) {
  __shared__ float partial[256];
  float acc = 0.0f;
  for (int i = threadIdx.x; i < m; i += 256) acc += x[i];
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = partial[0];
}
