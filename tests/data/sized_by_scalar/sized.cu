// Results whose size is a scalar argument: the call's value sizes them (issue 23, item 3).

// out[i] = i for i < n: an iota / arange, sized by n alone.
extern "C" __global__ void iota(long long* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i;
}

// out[r][i] = x[i] + r for r < rows: a tensor's size and a scalar's together.
extern "C" __global__ void repeat_rows(const float* x, float* out, int n_x, unsigned int rows) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned int r = blockIdx.y;
  if (i < n_x && r < rows) out[r * n_x + i] = x[i] + (float)r;
}
