// Device code as people write it for nvcc: C library headers, names nvcc's implicit includes
// make visible (INFINITY, M_PI, INT_MAX, uint), cooperative groups, cub and cuda::std. Under
// NVRTC from pip these come from kitdispatch's header set and the CCCL wheel, with no flag.
#include <assert.h>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cub/block/block_reduce.cuh>
#include <cuda/std/limits>

namespace cg = cooperative_groups;

// Per row of 256 columns (one block of 256 threads a row): the row's maximum through a
// cooperative-groups warp reduction and shared memory, the sum of floor(8x) through cub, and the
// constants C headers give.
extern "C" __global__ void __launch_bounds__(256) row_stats(const float* x, float* row_max, float* row_sum,
                                                              float* consts, int rows) {
  uint row = blockIdx.x;
  assert(row < (uint)rows);
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
  float v = x[row * 256 + threadIdx.x];
  float m = cg::reduce(warp, v, cg::greater<float>());
  __shared__ float warp_max[8];
  if (warp.thread_rank() == 0) warp_max[warp.meta_group_rank()] = m;
  typedef cub::BlockReduce<float, 256> Reduce;
  __shared__ typename Reduce::TempStorage temp;
  // Whole numbers, so that cub's order of additions and numpy's give the same sum.
  float s = Reduce(temp).Sum(floorf(v * 8.0f));
  block.sync();
  if (threadIdx.x == 0) {
    float best = -INFINITY;
    for (int w = 0; w < 8; ++w) best = fmaxf(best, warp_max[w]);
    row_max[row] = best;
    row_sum[row] = s;
  }
  if (row == 0 && threadIdx.x == 0) {
    consts[0] = FLT_MAX;
    consts[1] = (float)M_PI;
    consts[2] = (float)INT_MAX;
    consts[3] = (float)UINT32_MAX;
    consts[4] = std::sqrt(2.0f);
    consts[5] = cuda::std::numeric_limits<float>::lowest();
    consts[6] = isinf(INFINITY) && isnan(NAN) ? 1.0f : 0.0f;
    consts[7] = (float)(sizeof(int64_t) * CHAR_BIT + sizeof(std::uint8_t));
  }
}
