// A 3-D grid: out[z][y][x] = base[z][y][x] + x + 100*y + 10000*z, from blocks of 8x4x2 threads.
extern "C" __global__ void coords(const int* __restrict__ base, int* __restrict__ out, int X, int Y, int Z) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  int z = blockIdx.z * blockDim.z + threadIdx.z;
  if (x < X && y < Y && z < Z) {
    int i = (z * Y + y) * X + x;
    out[i] = base[i] + x + 100 * y + 10000 * z;
  }
}
