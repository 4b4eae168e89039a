// Row reductions of a row-major f32[rows, cols] tensor to f32[rows], through kit::fold_rows: 8
// lanes, a warp or the whole block take a row (kit::row_team: short rows need no block barrier
// and keep many rows in flight); each thread folds its elements from 16-byte loads, then warp
// shuffles (and, for a block, one shared-memory step) combine the partial results.
#include "../common/kit_device.cuh"

constexpr int kThreads = 256;

// The sum is kept in double: the adds are free next to the loads, and the result is the
// correctly rounded f32 of the exact sum for any realistic row, whatever the reduction tree (an
// f32 tree is off by ~1e-6 absolute on rows summing near 0).
struct Sum {
  typedef float Out;
  static __device__ double identity() { return 0.0; }
  static __device__ double fold(double acc, float v, int) { return acc + v; }
  static __device__ double fold4(double acc, float4 q, int) { return acc + ((double(q.x) + q.y) + (double(q.z) + q.w)); }
  static __device__ double combine(double a, double b) { return a + b; }
  static __device__ float finish(double acc) { return float(acc); }
};

// NaN propagates, as with numpy.max; an empty row gives -inf.
struct Max {
  typedef float Out;
  static __device__ float identity() { return kit::neg_inf(); }
  static __device__ float combine(float a, float b) { return (a > b || a != a) ? a : b; }
  static __device__ float fold(float acc, float v, int) { return combine(v, acc); }
  static __device__ float fold4(float acc, float4 q, int) { return combine(combine(combine(q.x, q.y), combine(q.z, q.w)), acc); }
  static __device__ float finish(float acc) { return acc; }
};

// out[r] = sum of row r
extern "C" __global__ void __launch_bounds__(kThreads, 4)
row_sum(const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
  kit::fold_rows<kThreads, Sum>(x, out, rows, cols);
}

// out[r] = max of row r
extern "C" __global__ void __launch_bounds__(kThreads, 4)
row_max(const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
  kit::fold_rows<kThreads, Max>(x, out, rows, cols);
}
