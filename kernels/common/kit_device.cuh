// Device helpers shared by the kernel families in kernels/ (included as "../common/kit_device.cuh").
//
// Header-free on purpose: kitdispatch gives NVRTC no CUDA include directory, so nothing here
// (or in the kernels) includes <cuda_fp16.h>, <mma.h>, <math.h> or <climits>. NVRTC's built-ins
// (float4, make_float4, __shfl_xor_sync, expf, ...) are all that is used.
#pragma once

namespace kit {

constexpr unsigned kFullMask = 0xffffffffu;  // every lane of a warp
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<unsigned long long>(p) & 15) == 0;
}

// ------------------------------------------------------------------ flat element-wise maps

// Each thread owns 4 consecutive elements, a block 4 * blockDim.x: one float4 per thread.
__device__ __forceinline__ long long chunk_start(long long block) {
  return (block * blockDim.x + threadIdx.x) * 4;
}

__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

template <class Op, class... V>
__device__ __forceinline__ float4 apply4(Op op, V... v) {
  return make_float4(op(v.x...), op(v.y...), op(v.z...), op(v.w...));
}

template <class... P>
__device__ __forceinline__ bool all_aligned16(const P*... p) {
  return (aligned16(p) && ...);
}

// out[i] = op(in[i]...) for this thread's 4 elements of a flat array of n: one 16-byte load per
// input and one 16-byte store when every pointer is 16-byte aligned and the 4 are in range,
// element by element otherwise (the tail, or misaligned views).
template <class Op, class... P>
__device__ __forceinline__ void map4(float* __restrict__ out, long long n, Op op, const P* __restrict__... in) {
  const long long i = chunk_start(blockIdx.x);
  if (i >= n) return;
  if (i + 4 <= n && all_aligned16(out, in...)) {
    store4(out + i, apply4(op, load4(in + i)...));
  } else {
    for (long long j = i; j < i + 4 && j < n; ++j) out[j] = op(in[j]...);
  }
}

// --------------------------------------------------------------------------- row walks

// Walks the elements of row[0, cols) that thread `rank` of a team of `size` threads owns, in
// increasing column order: f1(value, column) for a scalar head up to the first 16-byte boundary
// and for the tail, f4(float4, first column) for the aligned body in between. Every row gets
// 16-byte loads, whatever its offset. f4 sees the 4 values at once, so a fold can shorten its
// loop-carried dependency (the softmax rescales its running sum once per 4 elements).
template <class F1, class F4>
__device__ __forceinline__ void row_for_each(const float* __restrict__ row, int cols, int rank, int size, F1 f1, F4 f4) {
  const int head = min(cols, int(((16 - (reinterpret_cast<unsigned long long>(row) & 15)) & 15) >> 2));
  for (int c = rank; c < head; c += size) f1(row[c], c);
  const float4* body = reinterpret_cast<const float4*>(row + head);
  const int nvec = (cols - head) >> 2;
#pragma unroll 4
  for (int v = rank; v < nvec; v += size) f4(body[v], head + 4 * v);
  for (int c = head + 4 * nvec + rank; c < cols; c += size) f1(row[c], c);
}

// out[c] = f(in[c]) over a row, with float4 loads and stores where both rows share their
// 16-byte phase (always, for rows of two aligned [rows, cols] tensors).
template <class F>
__device__ __forceinline__ void row_map(const float* __restrict__ in, float* __restrict__ out, int cols, int rank, int size, F f) {
  const unsigned long long phase = reinterpret_cast<unsigned long long>(in) & 15;
  if (phase != (reinterpret_cast<unsigned long long>(out) & 15)) {
    for (int c = rank; c < cols; c += size) out[c] = f(in[c]);
    return;
  }
  const int head = min(cols, int(((16 - phase) & 15) >> 2));
  for (int c = rank; c < head; c += size) out[c] = f(in[c]);
  const int nvec = (cols - head) >> 2;
#pragma unroll 4
  for (int v = rank; v < nvec; v += size) {
    store4(out + head + 4 * v, apply4(f, load4(in + head + 4 * v)));
  }
  for (int c = head + 4 * nvec + rank; c < cols; c += size) out[c] = f(in[c]);
}

// ------------------------------------------------------------------------- reductions

// __shfl_xor_sync for any plain struct of 32-bit words (float, double, pairs).
template <class T>
__device__ __forceinline__ T shfl_xor(T v, int lane_mask, unsigned members = kFullMask) {
  static_assert(sizeof(T) % 4 == 0, "shfl_xor moves whole 32-bit words");
  union {
    T value;
    int words[sizeof(T) / 4];
  } u;  // NVRTC has no memcpy without headers; CUDA compilers define this kind of punning
  u.value = v;
#pragma unroll
  for (int i = 0; i < int(sizeof(T) / 4); ++i) u.words[i] = __shfl_xor_sync(members, u.words[i], lane_mask);
  return u.value;
}

template <class T, class Op>
__device__ __forceinline__ T warp_allreduce(T v, Op op) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = op(v, shfl_xor(v, m));
  return v;
}

// Reduces one value per thread over the whole block (any blockDim.x up to 1024); every thread
// gets the result. `identity` fills the lanes of warp 0 beyond the block's warp count. May be
// called several times in one kernel.
template <class T, class Op>
__device__ __forceinline__ T block_allreduce(T v, Op op, T identity) {
  __shared__ T partial[32];
  __shared__ T result;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  v = warp_allreduce(v, op);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = warp_allreduce(lane < int((blockDim.x + 31) >> 5) ? partial[lane] : identity, op);
    if (lane == 0) result = v;
  }
  __syncthreads();
  v = result;
  __syncthreads();  // the next call may overwrite partial and result
  return v;
}

// ------------------------------------------------------------------------------ rows

// Who works on a row: a slice of kLanes lanes of a warp (short rows: no block barrier, several
// rows in flight per warp or block), or the whole block (long rows). Both walk the rows
// grid-stride, so any grid size is correct; the manifests size the grid as
// ceildiv(rows, 32) + 1024 blocks (README).
template <int kLanes>  // 32: a warp; 8: a quarter warp (a power of 2)
struct LaneTeam {
  static_assert(kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "a power-of-2 slice of a warp");
  __device__ int rank() const { return threadIdx.x & (kLanes - 1); }
  __device__ int size() const { return kLanes; }
  __device__ long long first_row() const { return (long long)blockIdx.x * (blockDim.x / kLanes) + threadIdx.x / kLanes; }
  __device__ long long row_stride() const { return (long long)gridDim.x * (blockDim.x / kLanes); }
  // Slices of one warp may run different numbers of rows, so each shuffles with its own lanes only.
  template <class T, class Op>
  __device__ T allreduce(T v, Op op, T) const {
    if (kLanes == 32) return warp_allreduce(v, op);
    const unsigned mask = ((1u << (kLanes & 31)) - 1) << (threadIdx.x & 31 & ~(kLanes - 1));
#pragma unroll
    for (int m = kLanes / 2; m > 0; m >>= 1) v = op(v, shfl_xor(v, m, mask));
    return v;
  }
};

template <int kThreads>  // blockDim.x, known at compile time: offsets rank + i * size fold into addresses
struct BlockTeam {
  __device__ int rank() const { return threadIdx.x; }
  __device__ int size() const { return kThreads; }
  __device__ long long first_row() const { return blockIdx.x; }
  __device__ long long row_stride() const { return gridDim.x; }
  template <class T, class Op>
  __device__ T allreduce(T v, Op op, T identity) const { return block_allreduce(v, op, identity); }
};

// Who takes a row, for kernels that read it once: 8 lanes up to 256 columns, a warp up to 1024
// or when there are rows enough to keep every SM busy on their own, else the block (measured on
// H200, README).
enum class RowTeam { kSlice8, kWarp, kBlock };
__device__ __forceinline__ RowTeam row_team(long long rows, int cols) {
  return cols <= 256 ? RowTeam::kSlice8 : (cols <= 1024 || rows >= 2048) ? RowTeam::kWarp : RowTeam::kBlock;
}

// The rows of [0, rows) that this thread's team owns, grid-stride: body(team, row) for each.
template <class Team, class Body>
__device__ __forceinline__ void walk_rows(Team team, long long rows, Body body) {
  for (long long r = team.first_row(); r < rows; r += team.row_stride()) body(team, r);
}

// walk_rows with the team `kind` says. `body` is a struct with a `template <class Team> __device__ void operator()(Team, long long) const` (NVRTC
// treats a generic lambda's call operator as host code). blockDim.x must be kThreads.
template <int kThreads, class Body>
__device__ __forceinline__ void for_each_row(long long rows, RowTeam kind, Body body) {
  static_assert(kThreads % 32 == 0, "whole warps");
  if (kind == RowTeam::kSlice8) {
    walk_rows(LaneTeam<8>{}, rows, body);
  } else if (kind == RowTeam::kWarp) {
    walk_rows(LaneTeam<32>{}, rows, body);
  } else {
    walk_rows(BlockTeam<kThreads>{}, rows, body);
  }
}

// Reduces every row to one value with `Fold`, a struct of static functions: identity(), an
// accumulator; fold(acc, value, column) and fold4(acc, float4, first column), elements in
// increasing column order per thread; combine(a, b), associative and commutative;
// finish(acc) -> Fold::Out, written to out[row].
template <class Fold>
struct RowFold {
  const float* x;
  typename Fold::Out* out;
  int cols;

  template <class Team>
  __device__ void operator()(Team team, long long r) const {
    auto acc = Fold::identity();
    row_for_each(
        x + r * cols, cols, team.rank(), team.size(), [&](float v, int c) { acc = Fold::fold(acc, v, c); },
        [&](float4 q, int c) { acc = Fold::fold4(acc, q, c); });
    acc = team.allreduce(acc, Fold::combine, Fold::identity());
    if (team.rank() == 0) out[r] = Fold::finish(acc);
  }
};

template <int kThreads, class Fold>
__device__ __forceinline__ void fold_rows(const float* x, typename Fold::Out* out, int rows, int cols) {
  for_each_row<kThreads>(rows, row_team(rows, cols), RowFold<Fold>{x, out, cols});
}

}  // namespace kit
