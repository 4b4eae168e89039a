// Reverses each block of 64 floats through dynamic shared memory.
extern "C" __global__ void reverse_block(const float* __restrict__ x, float* __restrict__ out, int n) {
  extern __shared__ float tile[];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  int j = blockIdx.x * blockDim.x + (blockDim.x - 1 - threadIdx.x);
  if (j < n) out[j] = tile[threadIdx.x];
}
