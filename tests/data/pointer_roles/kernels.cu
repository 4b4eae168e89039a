// Kernels whose pointers' roles only the compiled code says (kitdispatch/roles.py).
#include <cuda_fp16.h>

// cuda-samples, Samples/6_Performance/transpose/transpose.cu, as published but for its
// cooperative-groups sync, here __syncthreads() (cooperative_groups.h needs CCCL headers that
// pip's NVRTC lacks): `idata` is not const but only read, so it is an input of the function,
// not a second result.
#define TILE_DIM 16
#define BLOCK_ROWS 16

__global__ void transposeNoBankConflicts(float *odata, float *idata, int width, int height) {
  __shared__ float tile[TILE_DIM][TILE_DIM + 1];

  int xIndex = blockIdx.x * TILE_DIM + threadIdx.x;
  int yIndex = blockIdx.y * TILE_DIM + threadIdx.y;
  int index_in = xIndex + (yIndex)*width;

  xIndex = blockIdx.y * TILE_DIM + threadIdx.x;
  yIndex = blockIdx.x * TILE_DIM + threadIdx.y;
  int index_out = xIndex + (yIndex)*height;

  for (int i = 0; i < TILE_DIM; i += BLOCK_ROWS) {
    tile[threadIdx.y + i][threadIdx.x] = idata[index_in + i * width];
  }

  __syncthreads();

  for (int i = 0; i < TILE_DIM; i += BLOCK_ROWS) {
    odata[index_out + i * height] = tile[threadIdx.x][threadIdx.y + i];
  }
}

// `acc` is loaded and stored: an in-place result (inout) without the manifest saying so.
extern "C" __global__ void accumulate(float* acc, float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) acc[i] += 2.0f * x[i];
}

// Two halves at a time: the tensors are declared in f16 elements (n of them, n even).
extern "C" __global__ void scale_half2(half2* out, const half2* in, int pairs) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < pairs) out[i] = __hmul2(in[i], __float2half2_rn(2.0f));
}
