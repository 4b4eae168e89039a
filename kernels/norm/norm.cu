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
// f32): a team of 1, 2, 4 or 8 warps takes a row and keeps it in registers, up to 4 16-byte
// chunks a thread (32 halves or 16 floats: a warp holds 1024 halves), so a block of 256 has 8,
// 4, 2 or 1 rows in flight. The grid says how wide the teams are: the fewest warps that hold
// the row, or twice as many (2 chunks a thread) where the rows fit one wave that way (the
// manifest's count: rows x warps <= 2048, 132 SMs x 2 blocks of 8 warps); measured on an H200,
// benchmarks/results/norm-h200-round34.txt. x, weight and bias are all loaded before the first
// reduction, so a row waits on memory once; values stay packed in their chunks between the
// passes. Longer rows: the block re-reads the row from global memory for each pass (layer:
// mean, variance, write; rms: sum of squares, write), mostly from L2. Rows walk grid-stride, so
// any grid is correct. At most 128 registers a thread, no spills (`nvcc -cubin -arch=sm_90a
// -Xptxas -v`): 2 blocks of 256 an SM (at 3, the 80-register cap spilled LayerNorm's three
// chunk sets and ran 25% slower at 4096 x 768). Loads and stores are 16 bytes where cols is a
// multiple of 8 halves or 4 floats and every pointer is 16-byte aligned, element by element
// otherwise. The variance is the two-pass one, sum((x - mean)^2), from registers.
#include "../common/kit_mma.cuh"

using kit::half_bits;

constexpr int kThreads = 256;
#ifndef KIT_NORM_CHUNKS  // the lab's knobs (benchmarks/investigations/norm_lab.py); the library builds the defaults
#define KIT_NORM_CHUNKS 4
#endif
#ifndef KIT_NORM_BLOCKS
#define KIT_NORM_BLOCKS 2
#endif
constexpr int kChunks = KIT_NORM_CHUNKS;  // 16-byte chunks a thread keeps in registers

// ------------------------------------------------------------------ element types

// How an element type is loaded, stored and rounded; values are computed as floats and kept as
// 16-byte chunks of kVec elements (Chunk) between the passes over a row.
struct F32 {
  typedef float T;
  typedef float4 Chunk;
  static constexpr int kVec = 4;
  static __device__ float get(const T* p, int i) { return p[i]; }
  static __device__ void put(T* p, int i, float v) { p[i] = v; }
  static __device__ float round(float v) { return v; }
  static __device__ Chunk load(const T* p) { return kit::load4(p); }
  static __device__ void store(T* p, Chunk c) { kit::store4(p, c); }
  static __device__ void unpack(Chunk c, float* v) { v[0] = c.x, v[1] = c.y, v[2] = c.z, v[3] = c.w; }
  static __device__ Chunk pack(const float* v) { return make_float4(v[0], v[1], v[2], v[3]); }
};

template <class E>  // kit::F16 or kit::BF16
struct Half {
  typedef half_bits T;
  typedef uint4 Chunk;
  static constexpr int kVec = 8;
  static __device__ float get(const T* p, int i) { return kit::to_float<E>(p[i]); }
  static __device__ void put(T* p, int i, float v) { p[i] = half_bits(kit::pack2<E>(v, 0.0f) & 0xffff); }
  static __device__ float round(float v) { return kit::to_float<E>(half_bits(kit::pack2<E>(v, 0.0f) & 0xffff)); }
  static __device__ Chunk load(const T* p) { return *reinterpret_cast<const uint4*>(p); }
  static __device__ void store(T* p, Chunk c) { *reinterpret_cast<uint4*>(p) = c; }
  static __device__ void unpack(Chunk c, float* v) {
    const unsigned w[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = kit::to_float<E>(half_bits(w[i] & 0xffff));
      v[2 * i + 1] = kit::to_float<E>(half_bits(w[i] >> 16));
    }
  }
  static __device__ Chunk pack(const float* v) {
    return make_uint4(kit::pack2<E>(v[0], v[1]), kit::pack2<E>(v[2], v[3]), kit::pack2<E>(v[4], v[5]), kit::pack2<E>(v[6], v[7]));
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
  typedef typename Elem::Chunk Chunk;
  static constexpr int kVec = Elem::kVec;

  const T* x;
  const T* weight;
  const T* bias;
  T* out;
  int cols;
  float eps;
  bool round_first;
  bool vector;  // 16-byte accesses: cols % kVec == 0 and every pointer aligned

  // Chunk k of a row (or of weight or bias): elements [k * kVec, k * kVec + kVec), zeros past the end.
  __device__ Chunk load(const T* row, int k) const {
    const int c0 = k * kVec;
    if (vector) return Elem::load(row + c0);
    float v[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = c0 + j < cols ? Elem::get(row, c0 + j) : 0.0f;
    return Elem::pack(v);
  }

  // The chunk's share of the statistic: the sum (layer) or the sum of squares (rms).
  __device__ float first_sum(Chunk c) const {
    float v[kVec], sum = 0.0f;
    Elem::unpack(c, v);
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum += kLayer ? v[j] : v[j] * v[j];
    return sum;
  }

  // The chunk's share of sum((x - mean)^2), columns past the end left out.
  __device__ float squared_deviations(Chunk c, int k, float mean) const {
    float v[kVec], sum = 0.0f;
    Elem::unpack(c, v);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float d = v[j] - mean;
      if (k * kVec + j < cols) sum += d * d;
    }
    return sum;
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

  // Chunk k of the output from the chunk's values c and its weight and bias chunks:
  // (c - shift) * scale, then weight and bias.
  __device__ void write(T* dst, int k, Chunk c, Chunk wc, Chunk bc, float shift, float scale) const {
    float v[kVec], w[kVec] = {}, b[kVec] = {};
    Elem::unpack(c, v);
    if (has_weight(kAffine)) Elem::unpack(wc, w);
    if (has_bias(kAffine)) Elem::unpack(bc, b);
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = finish((v[j] - shift) * scale, w[j], b[j]);
    const int c0 = k * kVec;
    if (vector) {
      Elem::store(dst + c0, Elem::pack(v));
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        if (c0 + j < cols) Elem::put(dst, c0 + j, v[j]);
      }
    }
  }

  // 1 / sqrt(statistic / cols + eps), as the ops compute it
  __device__ float inv_std(float sum) const { return rsqrtf(sum / float(cols) + eps); }

  // Rows of up to team.size() * kChunks chunks: the row stays in registers.
  template <class Team>
  __device__ void cached(Team team, const T* row, T* dst) const {
    const int chunks = (cols + kVec - 1) / kVec;
    Chunk xs[kChunks], ws[kChunks], bs[kChunks];
#pragma unroll
    for (int s = 0; s < kChunks; ++s) {  // every load before the first use: one wait on memory
      const int k = team.rank() + s * team.size();
      if (k < chunks) {
        xs[s] = load(row, k);
        if (has_weight(kAffine)) ws[s] = load(weight, k);
        if (has_bias(kAffine)) bs[s] = load(bias, k);
      }
    }
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < kChunks; ++s) {
      if (team.rank() + s * team.size() < chunks) sum += first_sum(xs[s]);
    }
    sum = team.allreduce(sum, add_op, 0.0f);
    float mean = 0.0f;
    if (kLayer) {
      mean = sum / float(cols);
      sum = 0.0f;
#pragma unroll
      for (int s = 0; s < kChunks; ++s) {
        const int k = team.rank() + s * team.size();
        if (k < chunks) sum += squared_deviations(xs[s], k, mean);
      }
      sum = team.allreduce(sum, add_op, 0.0f);
    }
    const float scale = inv_std(sum);
#pragma unroll
    for (int s = 0; s < kChunks; ++s) {
      const int k = team.rank() + s * team.size();
      if (k < chunks) write(dst, k, xs[s], ws[s], bs[s], mean, scale);
    }
  }

  // Longer rows: one pass over global memory per statistic, then one that writes.
  template <class Team>
  __device__ void streamed(Team team, const T* row, T* dst) const {
    const int chunks = (cols + kVec - 1) / kVec;
    float sum = 0.0f;
    for (int k = team.rank(); k < chunks; k += team.size()) sum += first_sum(load(row, k));
    sum = team.allreduce(sum, add_op, 0.0f);
    float mean = 0.0f;
    if (kLayer) {
      mean = sum / float(cols);
      sum = 0.0f;
      for (int k = team.rank(); k < chunks; k += team.size()) sum += squared_deviations(load(row, k), k, mean);
      sum = team.allreduce(sum, add_op, 0.0f);
    }
    const float scale = inv_std(sum);
    for (int k = team.rank(); k < chunks; k += team.size()) {
      const Chunk wc = has_weight(kAffine) ? load(weight, k) : Chunk{};
      const Chunk bc = has_bias(kAffine) ? load(bias, k) : Chunk{};
      write(dst, k, load(row, k), wc, bc, mean, scale);
    }
  }

  template <class Team>
  __device__ void operator()(Team team, long long r) const {
    if constexpr (Team::kSize < kThreads) {  // teams_per_block gives teams of a block only rows they hold
      cached(team, x + r * cols, out + r * cols);
    } else if (cols <= kThreads * kChunks * kVec) {
      cached(team, x + r * cols, out + r * cols);
    } else {
      streamed(team, x + r * cols, out + r * cols);
    }
  }
};

// Rows a block takes at once: as many teams as fit where a team of the fewest warps holds a row
// (8 for up to 32 * kChunks chunks, 4, 2, then 1), fewer where the grid leaves each block less
// than that to do (the manifest's count asks for wider teams so).
__device__ __forceinline__ int teams_per_block(long long rows, int chunks) {
  const int warps_needed = (chunks + 32 * kChunks - 1) / (32 * kChunks);
  int teams = warps_needed >= kThreads / 32 ? 1 : kThreads / 32 / warps_needed;
  teams = teams >= 8 ? 8 : teams >= 4 ? 4 : teams >= 2 ? 2 : 1;  // whole teams of a block
  const long long share = (rows + gridDim.x - 1) / gridDim.x;
  while (teams > 1 && teams / 2 >= share) teams /= 2;
  return teams;
}

template <class Elem, bool kLayer, int kAffine>
__device__ __forceinline__ void norm_rows(const typename Elem::T* x, const typename Elem::T* weight, const typename Elem::T* bias,
                                          typename Elem::T* out, float eps, int round_first, int rows, int cols) {
  const bool vector = cols % Elem::kVec == 0 && kit::aligned16(x) && kit::aligned16(out) &&
                      (!has_weight(kAffine) || kit::aligned16(weight)) && (!has_bias(kAffine) || kit::aligned16(bias));
  const NormRow<Elem, kLayer, kAffine> body{x, weight, bias, out, cols, eps, round_first != 0, vector};
  switch (teams_per_block(rows, (cols + Elem::kVec - 1) / Elem::kVec)) {
    case 8: kit::walk_rows(kit::WarpsTeam<1, kThreads>{}, rows, body); break;
    case 4: kit::walk_rows(kit::WarpsTeam<2, kThreads>{}, rows, body); break;
    case 2: kit::walk_rows(kit::WarpsTeam<4, kThreads>{}, rows, body); break;
    default: kit::walk_rows(kit::WarpsTeam<8, kThreads>{}, rows, body); break;
  }
}

// ------------------------------------------------------------------ entries

#define KIT_NORM_ENTRIES(SUFFIX, ELEM, T)                                                                              \
  extern "C" __global__ void __launch_bounds__(kThreads, KIT_NORM_BLOCKS) layer_norm_##SUFFIX(                                          \
      const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ out,          \
      float eps, int round_first, int rows, int cols) {                                                                \
    norm_rows<ELEM, true, kWeightBias>(x, weight, bias, out, eps, round_first, rows, cols);                            \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(kThreads, KIT_NORM_BLOCKS) layer_norm_nobias_##SUFFIX(                                   \
      const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ out, float eps, int round_first,          \
      int rows, int cols) {                                                                                            \
    norm_rows<ELEM, true, kWeight>(x, weight, nullptr, out, eps, round_first, rows, cols);                             \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(kThreads, KIT_NORM_BLOCKS) layer_norm_bias_##SUFFIX(                                     \
      const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ out, float eps, int round_first,            \
      int rows, int cols) {                                                                                            \
    norm_rows<ELEM, true, kBias>(x, nullptr, bias, out, eps, round_first, rows, cols);                                 \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(kThreads, KIT_NORM_BLOCKS) layer_norm_plain_##SUFFIX(                                    \
      const T* __restrict__ x, T* __restrict__ out, float eps, int round_first, int rows, int cols) {                  \
    norm_rows<ELEM, true, kNone>(x, nullptr, nullptr, out, eps, round_first, rows, cols);                              \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(kThreads, KIT_NORM_BLOCKS) rms_norm_##SUFFIX(                                            \
      const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ out, float eps, int round_first,          \
      int rows, int cols) {                                                                                            \
    norm_rows<ELEM, false, kWeight>(x, weight, nullptr, out, eps, round_first, rows, cols);                            \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(kThreads, KIT_NORM_BLOCKS) rms_norm_plain_##SUFFIX(                                      \
      const T* __restrict__ x, T* __restrict__ out, float eps, int round_first, int rows, int cols) {                  \
    norm_rows<ELEM, false, kNone>(x, nullptr, nullptr, out, eps, round_first, rows, cols);                             \
  }

KIT_NORM_ENTRIES(f32, F32, float)
KIT_NORM_ENTRIES(f16, Half<kit::F16>, half_bits)
KIT_NORM_ENTRIES(bf16, Half<kit::BF16>, half_bits)
