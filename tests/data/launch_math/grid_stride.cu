// A grid-stride loop launched with at most 64 blocks; it reports the grid it got.
#include "scale_config.h"
#include "warp_reduce.h"

extern "C" __global__ void scale_grid_stride(const float* __restrict__ x, float* __restrict__ y,
                                             int* __restrict__ blocks, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = SCALED(x[i]);
  if (blockIdx.x == 0 && threadIdx.x == 0) blocks[0] = gridDim.x;
}
