// Row softmax of a row-major f32[rows, cols] tensor, numerically stable:
// out[r, c] = exp(x[r, c] - max_r) / sum_c' exp(x[r, c'] - max_r).
//
// DRAM sees one read and one write per element:
// - rows of up to 8 * kCached columns: 8 lanes per row (4 rows per warp), each lane keeping its
//   values in registers between the max, the sum and the write;
// - up to 32 * kCached columns: the same with a warp per row;
// - up to 256 * kCached columns: the same with the whole block on a row;
// - longer rows: the block makes two passes. The first keeps a running (max, sum) per thread
//   ("online softmax": the sum is rescaled whenever the max grows), the block combines those
//   pairs, and the second writes exp(x - max) / sum with 16-byte loads and stores; its re-read
//   of the row mostly hits L2.
#include "../common/kit_device.cuh"

constexpr int kThreads = 256;
constexpr int kCached = 32;     // values per thread kept in registers (a warp or the block on a row)
constexpr int kSliceLanes = 8;  // short rows (up to 8 * kCached columns): 8 lanes per row, 4 rows per warp
constexpr int kTinySlots = 8;   // values per lane for rows of up to 64 columns (fewer idle slots)

__device__ __forceinline__ float exp_shifted(float x, float max) { return exp2f((x - max) * kit::kLog2e); }
__device__ __forceinline__ float max_op(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ float sum_op(float a, float b) { return a + b; }

// The row in registers: columns rank, rank + size, ... (coalesced 4-byte loads, kCached in flight).
// Slots past the row end are skipped, not computed: for a warp they are whole iterations.
template <int kSlots, class Team>
__device__ __forceinline__ void softmax_cached(Team team, const float* __restrict__ row, float* __restrict__ dst, int cols) {
  float v[kSlots];
  float max = kit::neg_inf();
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int c = team.rank() + i * team.size();
    v[i] = c < cols ? row[c] : kit::neg_inf();
    max = fmaxf(max, v[i]);
  }
  max = team.allreduce(max, max_op, kit::neg_inf());
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    if (team.rank() + i * team.size() < cols) {
      v[i] = exp_shifted(v[i], max);
      sum += v[i];
    }
  }
  const float inv_sum = 1.0f / team.allreduce(sum, sum_op, 0.0f);
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int c = team.rank() + i * team.size();
    if (c < cols) dst[c] = v[i] * inv_sum;
  }
}

struct MaxSum {
  float max;  // -inf: nothing seen yet
  float sum;  // sum of exp(x - max)
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  // An empty side (max -inf) adds nothing; exp(-inf - -inf) would be NaN.
  const float sa = a.max == kit::neg_inf() ? 0.0f : a.sum * exp_shifted(a.max, m);
  const float sb = b.max == kit::neg_inf() ? 0.0f : b.sum * exp_shifted(b.max, m);
  return MaxSum{m, sa + sb};
}

// Any length: a running (max, sum) pass, then a pass that re-reads the row and writes.
template <class Team>
__device__ __forceinline__ void softmax_online(Team team, const float* __restrict__ row, float* __restrict__ dst, int cols) {
  MaxSum s{kit::neg_inf(), 0.0f};
  kit::row_for_each(
      row, cols, team.rank(), team.size(),
      [&](float v, int) {
        if (v > s.max) {
          s.sum = s.sum * exp_shifted(s.max, v) + 1.0f;
          s.max = v;
        } else if (v != kit::neg_inf()) {  // -inf (a masked entry) adds 0; NaN poisons the sum
          s.sum += exp_shifted(v, s.max);
        }
      },
      [&](float4 q, int) {  // rescale once per 4 elements, then 4 independent exps
        const float m4 = fmaxf(fmaxf(q.x, q.y), fmaxf(q.z, q.w));
        if (m4 > s.max) {
          s.sum *= exp_shifted(s.max, m4);
          s.max = m4;
        }
        if (s.max != kit::neg_inf()) {  // else all seen so far are -inf: they add 0
          s.sum += (exp_shifted(q.x, s.max) + exp_shifted(q.y, s.max)) + (exp_shifted(q.z, s.max) + exp_shifted(q.w, s.max));
        }
      });
  s = team.allreduce(s, combine, MaxSum{kit::neg_inf(), 0.0f});
  const float max = s.max, inv_sum = 1.0f / s.sum;
  kit::row_map(row, dst, cols, team.rank(), team.size(), [=](float v) { return exp_shifted(v, max) * inv_sum; });
}

struct RowSoftmax {
  const float* x;
  float* out;
  int cols;

  template <class Team>
  __device__ void operator()(Team team, long long r) const {
    if (team.size() == kSliceLanes && cols <= kSliceLanes * kTinySlots) {
      softmax_cached<kTinySlots>(team, x + r * cols, out + r * cols, cols);
    } else if (cols <= team.size() * kCached) {
      softmax_cached<kCached>(team, x + r * cols, out + r * cols, cols);
    } else {
      softmax_online(team, x + r * cols, out + r * cols, cols);
    }
  }
};

extern "C" __global__ void __launch_bounds__(kThreads, 4)
row_softmax(const float* __restrict__ x, float* __restrict__ out, int rows, int cols) {
  const RowSoftmax body{x, out, cols};
  if (cols <= kSliceLanes * kCached) {
    kit::walk_rows(kit::LaneTeam<kSliceLanes>{}, rows, body);
  } else if (cols <= 32 * kCached) {
    kit::walk_rows(kit::LaneTeam<32>{}, rows, body);
  } else {
    kit::walk_rows(kit::BlockTeam<kThreads>{}, rows, body);
  }
}
