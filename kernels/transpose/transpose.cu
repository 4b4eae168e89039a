// Tiled transpose of a row-major f32[rows, cols] tensor to f32[cols, rows].
//
// A block of 32 x 8 threads moves one 32 x 32 tile through shared memory; the tile row is padded
// to 33 floats, so reading a column of the tile hits 32 different banks.
// - Full tiles of a tensor whose rows and cols are multiples of 4 (and 16-byte aligned, as IREE's
//   buffers are): one 16-byte load and one 16-byte store per thread. Each warp reads 4 rows x 128
//   contiguous bytes of the input and writes 4 rows x 128 contiguous bytes of the output.
// - Anything else (edge tiles, other widths): 4 guarded 4-byte loads and stores per thread, each
//   warp still reading and writing 128 contiguous bytes.
#include "../common/kit_device.cuh"

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;  // blockDim.y

__device__ __forceinline__ void transpose_tile_vec4(float (&tile)[kTile][kTile + 1], const float* __restrict__ x,
                                                    float* __restrict__ out, int rows, int cols, int r0, int c0) {
  const int t = threadIdx.y * kTile + threadIdx.x;
  const int lr = t / 8, lc = t % 8 * 4;  // tile row lr, columns lc .. lc + 3
  const float4 q = kit::load4(x + (long long)(r0 + lr) * cols + c0 + lc);
  tile[lr][lc] = q.x;
  tile[lr][lc + 1] = q.y;
  tile[lr][lc + 2] = q.z;
  tile[lr][lc + 3] = q.w;
  __syncthreads();
  // Output row c0 + lr, columns r0 + lc .. + 3: tile column lr, rows lc .. lc + 3.
  kit::store4(out + (long long)(c0 + lr) * rows + r0 + lc,
              make_float4(tile[lc][lr], tile[lc + 1][lr], tile[lc + 2][lr], tile[lc + 3][lr]));
}

__device__ __forceinline__ void transpose_tile_scalar(float (&tile)[kTile][kTile + 1], const float* __restrict__ x,
                                                      float* __restrict__ out, int rows, int cols, int r0, int c0) {
  const int tx = threadIdx.x, ty = threadIdx.y;
#pragma unroll
  for (int j = ty; j < kTile; j += kRowsPerPass) {
    if (r0 + j < rows && c0 + tx < cols) tile[j][tx] = x[(long long)(r0 + j) * cols + c0 + tx];
  }
  __syncthreads();
#pragma unroll
  for (int j = ty; j < kTile; j += kRowsPerPass) {
    if (c0 + j < cols && r0 + tx < rows) out[(long long)(c0 + j) * rows + r0 + tx] = tile[tx][j];
  }
}

extern "C" __global__ void __launch_bounds__(kTile * kRowsPerPass)
transpose(const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
  __shared__ float tile[kTile][kTile + 1];
  const int r0 = blockIdx.y * kTile, c0 = blockIdx.x * kTile;
  const bool vec = r0 + kTile <= rows && c0 + kTile <= cols && rows % 4 == 0 && cols % 4 == 0 &&
                   kit::all_aligned16(x, out);
  if (vec) {
    transpose_tile_vec4(tile, x, out, rows, cols, r0, c0);
  } else {
    transpose_tile_scalar(tile, x, out, rows, cols, r0, c0);
  }
}
