// LayerNorm and RMSNorm over the last dim of a row-major x[rows, cols], f16, bf16 or f32 in and
// out, statistics in f32:
//   layer: y = (x - mean) / sqrt(var + eps) * weight + bias   (var: the biased variance)
//   rms:   y = x / sqrt(mean(x^2) + eps) * weight
// with weight and bias / weight only / neither (weight and bias: [cols], x's type).
// `round_first` (0 or 1) says where the result is rounded to x's type: 1 rounds the normalized
// value first and then each product and sum with weight and bias, as f16/bf16 arithmetic does
// (what IREE's import of an f16 ONNX LayerNormalization computes, and Llama's
// `weight * x.to(f16)`); 0 applies weight and bias in f32 and rounds once. No effect for f32.
//
// DRAM sees one read of x and one write per element for rows of up to 8192 columns (4096 for
// f32):
// - up to 1024 columns (512 for f32) a warp takes a row (8 rows per block of 256), each lane
//   keeping its values in registers (32 halves or 16 floats) between the statistics and the write,
//   unless the grid has a block for every row (few rows: the manifest's count), then the block;
// - up to 8192 columns (4096 for f32) the whole block takes a row, the same way;
// - longer rows: the block re-reads the row from global memory for each pass (layer: mean,
//   variance, write; rms: sum of squares, write), mostly from L2.
// Rows walk grid-stride, so any grid is correct. At most 85 registers a thread, no spills, on
// sm_80 and sm_90 (`nvcc -cubin -arch=sm_90 -Xptxas -v`): 3 blocks of 256 an SM; 32 floats a
// thread took 196 registers. Loads and stores are 16 bytes (8 halves or 4 floats) where cols is
// a multiple of that and every pointer is 16-byte aligned, element by element otherwise. The variance is the two-pass one, sum((x - mean)^2), from registers.
#include "../common/kit_mma.cuh"

using kit::half_bits;

constexpr int kThreads = 256;

// ------------------------------------------------------------------ element types

// How an element type is loaded, stored and rounded; values travel as floats. kVec elements
// make one 16-byte access; kCached values a thread are kept in registers (a warp takes rows of
// up to 32 * kCached columns, the block up to kThreads * kCached).
struct F32 {
  typedef float T;
  static constexpr int kVec = 4;
  static constexpr int kCached = 16;
  static __device__ float get(const T* p, int i) { return p[i]; }
  static __device__ void put(T* p, int i, float v) { p[i] = v; }
  static __device__ float round(float v) { return v; }
  static __device__ void load(const T* p, float* v) {
    const float4 q = kit::load4(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  }
  static __device__ void store(T* p, const float* v) { kit::store4(p, make_float4(v[0], v[1], v[2], v[3])); }
};

template <class E>  // kit::F16 or kit::BF16
struct Half {
  typedef half_bits T;
  static constexpr int kVec = 8;
  static constexpr int kCached = 32;
  static __device__ float get(const T* p, int i) { return kit::to_float<E>(p[i]); }
  static __device__ void put(T* p, int i, float v) { p[i] = half_bits(kit::pack2<E>(v, 0.0f) & 0xffff); }
  static __device__ float round(float v) { return kit::to_float<E>(half_bits(kit::pack2<E>(v, 0.0f) & 0xffff)); }
  static __device__ void load(const T* p, float* v) {
    const uint4 q = *reinterpret_cast<const uint4*>(p);
    const unsigned w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = kit::to_float<E>(half_bits(w[i] & 0xffff));
      v[2 * i + 1] = kit::to_float<E>(half_bits(w[i] >> 16));
    }
  }
  static __device__ void store(T* p, const float* v) {
    *reinterpret_cast<uint4*>(p) =
        make_uint4(kit::pack2<E>(v[0], v[1]), kit::pack2<E>(v[2], v[3]), kit::pack2<E>(v[4], v[5]), kit::pack2<E>(v[6], v[7]));
  }
};

// ------------------------------------------------------------------ one row

// What a norm applies after normalizing: kBias is a LayerNorm whose weight of ones the model's
// compiler folded away (GPT-2 from its initial weights), leaving the bias alone.
enum Affine { kNone = 0, kWeight = 1, kWeightBias = 2, kBias = 3 };
__host__ __device__ constexpr bool has_weight(int a) { return a == kWeight || a == kWeightBias; }
__host__ __device__ constexpr bool has_bias(int a) { return a == kWeightBias || a == kBias; }

__device__ __forceinline__ float add_op(float a, float b) { return a + b; }

template <class Elem, bool kLayer, int kAffine>
struct NormRow {
  typedef typename Elem::T T;
  static constexpr int kVec = Elem::kVec;
  static constexpr int kChunks = Elem::kCached / kVec;  // 16-byte chunks per thread in registers

  const T* x;
  const T* weight;
  const T* bias;
  T* out;
  int cols;
  float eps;
  bool round_first;
  bool vector;  // 16-byte accesses: cols % kVec == 0 and every pointer aligned

  // Chunk k of a row (or of weight or bias): elements [k * kVec, k * kVec + kVec), zeros past the end.
  __device__ void load(const T* row, int k, float* v) const {
    const int c0 = k * kVec;
    if (vector) {
      Elem::load(row + c0, v);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[j] = c0 + j < cols ? Elem::get(row, c0 + j) : 0.0f;
    }
  }

  // A normalized value n, with its column's weight w and bias b applied as round_first says.
  __device__ float finish(float n, float w, float b) const {
    if (round_first) {
      n = Elem::round(n);
      if (has_weight(kAffine)) n = Elem::round(n * w);
      if (has_bias(kAffine)) n = Elem::round(n + b);
    } else {
      if (has_weight(kAffine)) n *= w;
      if (has_bias(kAffine)) n += b;
    }
    return n;
  }

  // Chunk k of the output from the chunk's values v: (v - shift) * scale, then weight and bias.
  __device__ void write(T* dst, int k, float* v, float shift, float scale) const {
    const int c0 = k * kVec;
    float w[kVec] = {}, b[kVec] = {};
    if (has_weight(kAffine)) load(weight, k, w);
    if (has_bias(kAffine)) load(bias, k, b);
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = finish((v[j] - shift) * scale, w[j], b[j]);
    if (vector) {
      Elem::store(dst + c0, v);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        if (c0 + j < cols) Elem::put(dst, c0 + j, v[j]);
      }
    }
  }

  // 1 / sqrt(statistic / cols + eps), as the ops compute it
  __device__ float inv_std(float sum) const { return rsqrtf(sum / float(cols) + eps); }

  // Rows of up to team.size() * kCached columns: the row stays in registers.
  template <class Team>
  __device__ void cached(Team team, const T* row, T* dst) const {
    float v[kChunks][kVec];
    const int chunks = (cols + kVec - 1) / kVec;
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < kChunks; ++s) {
      const int k = team.rank() + s * team.size();
      if (k < chunks) {
        load(row, k, v[s]);
#pragma unroll
        for (int j = 0; j < kVec; ++j) sum += kLayer ? v[s][j] : v[s][j] * v[s][j];
      }
    }
    sum = team.allreduce(sum, add_op, 0.0f);
    float mean = 0.0f;
    if (kLayer) {
      mean = sum / float(cols);
      sum = 0.0f;
#pragma unroll
      for (int s = 0; s < kChunks; ++s) {
        const int k = team.rank() + s * team.size();
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float d = v[s][j] - mean;
          if (k < chunks && k * kVec + j < cols) sum += d * d;
        }
      }
      sum = team.allreduce(sum, add_op, 0.0f);
    }
    const float scale = inv_std(sum);
#pragma unroll
    for (int s = 0; s < kChunks; ++s) {
      const int k = team.rank() + s * team.size();
      if (k < chunks) write(dst, k, v[s], mean, scale);
    }
  }

  // Longer rows: one pass over global memory per statistic, then one that writes.
  template <class Team>
  __device__ void streamed(Team team, const T* row, T* dst) const {
    const int chunks = (cols + kVec - 1) / kVec;
    float v[kVec];
    float sum = 0.0f;
    for (int k = team.rank(); k < chunks; k += team.size()) {
      load(row, k, v);
#pragma unroll
      for (int j = 0; j < kVec; ++j) sum += kLayer ? v[j] : v[j] * v[j];
    }
    sum = team.allreduce(sum, add_op, 0.0f);
    float mean = 0.0f;
    if (kLayer) {
      mean = sum / float(cols);
      sum = 0.0f;
      for (int k = team.rank(); k < chunks; k += team.size()) {
        load(row, k, v);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float d = v[j] - mean;
          if (k * kVec + j < cols) sum += d * d;
        }
      }
      sum = team.allreduce(sum, add_op, 0.0f);
    }
    const float scale = inv_std(sum);
    for (int k = team.rank(); k < chunks; k += team.size()) {
      load(row, k, v);
      write(dst, k, v, mean, scale);
    }
  }

  template <class Team>
  __device__ void operator()(Team team, long long r) const {
    if (cols <= team.size() * Elem::kCached) {
      cached(team, x + r * cols, out + r * cols);
    } else {
      streamed(team, x + r * cols, out + r * cols);
    }
  }
};

template <class Elem, bool kLayer, int kAffine>
__device__ __forceinline__ void norm_rows(const typename Elem::T* x, const typename Elem::T* weight, const typename Elem::T* bias,
                                          typename Elem::T* out, float eps, int round_first, int rows, int cols) {
  const bool vector = cols % Elem::kVec == 0 && kit::aligned16(x) && kit::aligned16(out) &&
                      (!has_weight(kAffine) || kit::aligned16(weight)) && (!has_bias(kAffine) || kit::aligned16(bias));
  const NormRow<Elem, kLayer, kAffine> body{x, weight, bias, out, cols, eps, round_first != 0, vector};
  // A warp a row, each lane with up to kCached / kVec chunks, keeps the SMs busy only with rows
  // enough: a lane's chunks wait on each other's loads and stores. Where a block a row was
  // launched (the manifest's count does so for few rows) the block takes a row instead.
  if (cols <= 32 * Elem::kCached && gridDim.x < rows) {
    kit::walk_rows(kit::LaneTeam<32>{}, rows, body);
  } else {
    kit::walk_rows(kit::BlockTeam<kThreads>{}, rows, body);
  }
}

// ------------------------------------------------------------------ entries

#define KIT_NORM_ENTRIES(SUFFIX, ELEM, T)                                                                              \
  extern "C" __global__ void __launch_bounds__(kThreads, 3) layer_norm_##SUFFIX(                                          \
      const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ out,          \
      float eps, int round_first, int rows, int cols) {                                                                \
    norm_rows<ELEM, true, kWeightBias>(x, weight, bias, out, eps, round_first, rows, cols);                            \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(kThreads, 3) layer_norm_nobias_##SUFFIX(                                   \
      const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ out, float eps, int round_first,          \
      int rows, int cols) {                                                                                            \
    norm_rows<ELEM, true, kWeight>(x, weight, nullptr, out, eps, round_first, rows, cols);                             \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(kThreads, 3) layer_norm_bias_##SUFFIX(                                     \
      const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ out, float eps, int round_first,            \
      int rows, int cols) {                                                                                            \
    norm_rows<ELEM, true, kBias>(x, nullptr, bias, out, eps, round_first, rows, cols);                                 \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(kThreads, 3) layer_norm_plain_##SUFFIX(                                    \
      const T* __restrict__ x, T* __restrict__ out, float eps, int round_first, int rows, int cols) {                  \
    norm_rows<ELEM, true, kNone>(x, nullptr, nullptr, out, eps, round_first, rows, cols);                              \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(kThreads, 3) rms_norm_##SUFFIX(                                            \
      const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ out, float eps, int round_first,          \
      int rows, int cols) {                                                                                            \
    norm_rows<ELEM, false, kWeight>(x, weight, nullptr, out, eps, round_first, rows, cols);                            \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(kThreads, 3) rms_norm_plain_##SUFFIX(                                      \
      const T* __restrict__ x, T* __restrict__ out, float eps, int round_first, int rows, int cols) {                  \
    norm_rows<ELEM, false, kNone>(x, nullptr, nullptr, out, eps, round_first, rows, cols);                             \
  }

KIT_NORM_ENTRIES(f32, F32, float)
KIT_NORM_ENTRIES(f16, Half<kit::F16>, half_bits)
KIT_NORM_ENTRIES(bf16, Half<kit::BF16>, half_bits)
