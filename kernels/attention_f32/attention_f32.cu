// Fused f32 attention forward (flash attention on CUDA cores: one pass over K and V with an
// online softmax): O = softmax(Q K^T * scale (+ mask)) V per batch and head, every value and
// every operation f32 (no tensor cores, no rounding to a narrower type). Head dims up to 64
// (past 64: O is NaN, loud, not wrong). The layouts and masks of attention.cu's entries, named
// with _f32: [b, h, s, d], _bshd, _kt (K^T), _qkv (packed), _gqa, _cross, _pad (key padding).
//
// One launch for every GPU from sm_80: blocks of 256 threads, each owning 64 query rows of one
// head (grid ceildiv(s, 64) x h x b), 68 KB of dynamic shared memory. Shared memory holds Q^T,
// one K^T tile and one V tile (64 keys), and P^T, each 64 rows of 68 floats (16-byte aligned
// rows, padded so the transposing stores are conflict-light). Thread (ty, tx) of a 16 x 16 grid
// computes scores for query rows 4ty..4ty+3 against keys 4tx..4tx+3 of the tile and O's head
// dims 4tx..4tx+3 for the same rows: each step of either product is two 16-byte shared loads
// and 16 FMAs. The next K tile is copied in (cp.async) while the softmax and P V of this one
// run, the next V tile while the next scores are computed.
//
// The softmax is the model's: scores x = q.k * scale (plus the key-padding bias or the causal
// masked value, in f32, as the model's f32 chain adds them), p = exp(x - max) with the running
// max, so a row whose every key carries the dtype's lowest gets the model's uniform weights.

#include "../attention/layouts.cuh"

namespace {

using namespace kit_attention;

constexpr int kThreads = 256;
constexpr int BM = 64;       // query rows per block
constexpr int BN = 64;       // keys per tile
constexpr int D = 64;        // the largest head dim (smaller ones: zero columns past d)
constexpr int kRow = 68;     // floats per shared row: 64 and 4 of padding (rows stay 16-byte aligned)
constexpr int kTile = 64 * kRow;
constexpr int kDynamicSmem = 4 * kTile * 4;  // kitdispatch.toml's dynamic_shared_memory: 69632
constexpr float kLog2e = 1.4426950408889634f;
constexpr unsigned kFullMask = 0xffffffffu;
static_assert(kDynamicSmem <= 99 * 1024, "within every GPU's opt-in shared memory from sm_80 (sm_86 and sm_89: 99 KB)");

struct Problem {
  const float* q;
  const float* k;
  const float* v;
  float* o;
  int s;     // queries
  int sk;    // keys (s but for cross-attention)
  int q0;    // first query row of this block
  int d;     // the head dim (<= D)
  long long q_row, k_row, v_row, o_row;  // elements between rows (K^T: between its d rows)
  float scale;
  const float* bias;  // the key-padding bias of this block's batch row (the _pad variants)
  float masked;       // what the causal _pad variants' model adds past the diagonal
};

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// A 4-byte copy global -> shared that zero-fills where `ok` is false (src is then not read).
__device__ __forceinline__ void cp_async4(float* dst, const float* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(ok ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// Rows [r0, r0 + 64) of an [rows, d] matrix (rows `stride` elements apart) -> shared `dst` as
// its transpose [D][kRow] (dst[e * kRow + r]), zeros past row `rows` and column d. Consecutive
// threads read consecutive columns of a row (coalesced) and write down a shared column.
__device__ __forceinline__ void load_transposing(float* dst, const float* src, int r0, int rows, long long stride, int d) {
  for (int i = threadIdx.x; i < 64 * D; i += kThreads) {
    const int e = i % D, r = i / D;
    const bool ok = r0 + r < rows && e < d;
    cp_async4(dst + e * kRow + r, ok ? src + (r0 + r) * stride + e : src, ok);
  }
}

// Rows [r0, r0 + 64) of an [rows, d] matrix -> shared `dst` as they are ([64][kRow]), zeros
// past row `rows` and column d. Also K^T's keys [r0, r0 + 64) of its d rows (`by_columns`: src
// is [d, rows], rows `stride` apart) into the same K^T tile layout as load_transposing's.
__device__ __forceinline__ void load_rows(float* dst, const float* src, int r0, int rows, long long stride, int d) {
  for (int i = threadIdx.x; i < 64 * D; i += kThreads) {
    const int e = i % D, r = i / D;
    const bool ok = r0 + r < rows && e < d;
    cp_async4(dst + r * kRow + e, ok ? src + (r0 + r) * stride + e : src, ok);
  }
}

__device__ __forceinline__ void load_kt_columns(float* dst, const float* src, int r0, int rows, long long stride, int d) {
  for (int i = threadIdx.x; i < 64 * D; i += kThreads) {
    const int r = i % 64, e = i / 64;
    const bool ok = r0 + r < rows && e < d;
    cp_async4(dst + e * kRow + r, ok ? src + e * stride + r0 + r : src, ok);
  }
}

template <Order KL>
__device__ __forceinline__ void load_keys(float* kt, const Problem& p, int t) {
  if constexpr (KL == BHDS) {
    load_kt_columns(kt, p.k, t * BN, p.sk, p.k_row, p.d);
  } else {
    load_transposing(kt, p.k, t * BN, p.sk, p.k_row, p.d);
  }
}

// The max and the sum of a row over the 16 lanes that hold it (lanes tx = 0..15 of one ty).
__device__ __forceinline__ float row_max(float x) {
#pragma unroll
  for (int m = 1; m < 16; m *= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, m));
  return x;
}
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int m = 1; m < 16; m *= 2) x += __shfl_xor_sync(kFullMask, x, m);
  return x;
}

__device__ __forceinline__ float at(const float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// One step of a 4 x 4 register tile: acc[i][j] += a[i] * b[j], a and b each one 16-byte shared load.
__device__ __forceinline__ void fma_4x4(float (&acc)[4][4], const float* a, const float* b) {
  const float4 x = *reinterpret_cast<const float4*>(a), y = *reinterpret_cast<const float4*>(b);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc[i][0] = fmaf(at(x, i), y.x, acc[i][0]);
    acc[i][1] = fmaf(at(x, i), y.y, acc[i][1]);
    acc[i][2] = fmaf(at(x, i), y.z, acc[i][2]);
    acc[i][3] = fmaf(at(x, i), y.w, acc[i][3]);
  }
}

template <bool kCausal, Order KL, bool kPad>
__device__ void block(const Problem& p, float* smem) {
  float* qt = smem;              // Q^T [D][kRow]: this block's query rows as columns
  float* kt = qt + kTile;        // K^T tile [D][kRow]
  float* vs = kt + kTile;        // V tile [BN][kRow]
  float* pt = vs + kTile;        // P^T [BN][kRow]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;

  // Keys past last_key are masked for every row. With padding, a causal row whose keys 0..i are
  // all padded (left padding) takes the later keys' masked scores too, as the model's softmax
  // does: the block then runs over every key.
  const bool every_key = kPad && kCausal && p.bias[0] != 0.f;
  const int last_key = kCausal && !every_key ? min(p.sk, p.q0 + BM) : p.sk;
  const int ntiles = (last_key + BN - 1) / BN;

  load_transposing(qt, p.q, p.q0, p.s, p.q_row, p.d);
  load_keys<KL>(kt, p, 0);
  cp_async_commit();
  load_rows(vs, p.v, 0, p.sk, p.v_row, p.d);
  cp_async_commit();

  float o[4][4] = {};
  float m[4], l[4] = {};
#pragma unroll
  for (int i = 0; i < 4; ++i) m[i] = neg_inf();

  for (int t = 0; t < ntiles; ++t) {
    cp_async_wait<1>();  // Q and this K tile are in (this V tile may not be)
    __syncthreads();

    // S = Q K^T for rows 4ty.., keys 4tx..
    float sc[4][4] = {};
#pragma unroll 16
    for (int e = 0; e < D; ++e) fma_4x4(sc, qt + e * kRow + 4 * ty, kt + e * kRow + 4 * tx);
    __syncthreads();  // everyone is done with this K tile: the next one may come in
    if (t + 1 < ntiles) load_keys<KL>(kt, p, t + 1);
    cp_async_commit();

    // The scores as the model has them, and the online softmax (natural log domain: a row of
    // lowest values gives 0 differences, as the model's softmax does).
    const int key0 = t * BN + 4 * tx;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = p.q0 + 4 * ty + i;
      float mx = m[i];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int key = key0 + j;
        float x = sc[i][j] * p.scale;
        if (key >= p.sk) {
          x = neg_inf();
        } else if (kPad && kCausal && key > row) {
          x += p.masked;  // the model adds its masked value, not the bias, past the diagonal
        } else if (kPad) {
          x += p.bias[key];
        } else if (kCausal && key > row) {
          x = neg_inf();
        }
        sc[i][j] = x;
        mx = fmaxf(mx, x);
      }
      mx = row_max(mx);
      // A row with every key masked so far keeps max -inf: subtract 0 (not -inf - -inf = NaN).
      const float ref = mx == neg_inf() ? 0.f : mx;
      const float alpha = exp2f((m[i] - ref) * kLog2e);
      m[i] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        sc[i][j] = exp2f((sc[i][j] - ref) * kLog2e);
        sum += sc[i][j];
      }
      l[i] = l[i] * alpha + sum;  // this lane's part of the row's sum (same alpha in every lane)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[i][c] *= alpha;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
      *reinterpret_cast<float4*>(pt + (4 * tx + j) * kRow + 4 * ty) = make_float4(sc[0][j], sc[1][j], sc[2][j], sc[3][j]);
    cp_async_wait<1>();  // this V tile is in (the next K tile may not be)
    __syncthreads();

    // O += P V for rows 4ty.., head dims 4tx..
#pragma unroll 16
    for (int j = 0; j < BN; ++j) fma_4x4(o, pt + j * kRow + 4 * ty, vs + j * kRow + 4 * tx);
    __syncthreads();  // everyone is done with this V tile and P
    if (t + 1 < ntiles) load_rows(vs, p.v, (t + 1) * BN, p.sk, p.v_row, p.d);
    cp_async_commit();
  }
  cp_async_wait<0>();

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float inv = 1.f / row_sum(l[i]);
    const int row = p.q0 + 4 * ty + i;
    if (row >= p.s) continue;
#pragma unroll
    for (int c = 0; c < 4; ++c)
      if (4 * tx + c < p.d) p.o[row * p.o_row + 4 * tx + c] = o[i][c] * inv;
  }
}

__device__ void fill_nan(const Problem& p) {
  for (int i = threadIdx.x; i < BM * p.d; i += kThreads) {
    const int r = p.q0 + i / p.d;
    if (r < p.s) p.o[r * p.o_row + i % p.d] = __int_as_float(0x7fffffff);
  }
}

// The block's query rows: blocks start in reverse order, so the causal variant's longest rows
// (the last ones) go first and the short ones fill in at the end. K and V have g heads, each
// shared by h / g query heads (g = h: one each; g < h: grouped-query attention).
template <bool kCausal, Order QL = BHSD, Order KL = BHSD, Order VL = BHSD, Order OL = BHSD, bool kPad = false>
__device__ __forceinline__ void attention(const float* q, const float* k, const float* v, float* o, int b, int h, int s, int d,
                                          int g = 0, float scale = 0.f, int t = 0, const float* bias = nullptr, float masked = 0.f) {
  extern __shared__ __align__(16) float dyn_smem[];
  const bool grouped = g > 0 && g != h;
  const int kv_heads = grouped && h % g == 0 ? g : h;
  const int keys = t > 0 ? t : s;  // cross-attention: t keys for s queries
  const int head = blockIdx.y, kv_head = head / (h / kv_heads);
  Problem p{q + head_offset<QL>(h, head, s, d), k + head_offset<KL>(kv_heads, kv_head, keys, d),
            v + head_offset<VL>(kv_heads, kv_head, keys, d), o + head_offset<OL>(h, head, s, d),
            s, keys, int(gridDim.x - 1 - blockIdx.x) * BM, d,
            row_stride<QL>(h, s, d), row_stride<KL>(kv_heads, keys, d), row_stride<VL>(kv_heads, keys, d), row_stride<OL>(h, s, d),
            scale > 0.f ? scale : rsqrtf(float(d)),  // the op's, where the entry takes it
            kPad ? bias + (long long)blockIdx.z * keys : nullptr, masked};
  if ((grouped && h % g != 0) || d > D || d < 1) {  // loud, not wrong
    if (d >= 1) fill_nan(p);
    return;
  }
  block<kCausal, KL, kPad>(p, dyn_smem);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(256, 2)
attention_f32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ o,
              int b, int h, int s, int d) {
  attention<false>(q, k, v, o, b, h, s, d);
}

extern "C" __global__ void __launch_bounds__(256, 2)
attention_causal_f32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ o,
                     int b, int h, int s, int d) {
  attention<true>(q, k, v, o, b, h, s, d);
}

// Layouts as attention.cu's entries of the same names (less the _f32): _bshd GPT-2's split
// heads, _kt BERT's and ViT's (Q and V [b, h, s, d], K^T [b, h, d, s], O [b, s, h, d]); the
// softmax scale is an argument (the op's constant).
#define KIT_ATTENTION_F32_VARIANT(NAME, CAUSAL, QL, KL, VL, OL)                                                       \
  extern "C" __global__ void __launch_bounds__(256, 2)                                                                \
  NAME(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ o,   \
       float scale, int b, int h, int s, int d) {                                                                     \
    attention<CAUSAL, QL, KL, VL, OL>(q, k, v, o, b, h, s, d, 0, scale);                                              \
  }

KIT_ATTENTION_F32_VARIANT(attention_bshd_f32, false, BSHD, BSHD, BSHD, BSHD)
KIT_ATTENTION_F32_VARIANT(attention_causal_bshd_f32, true, BSHD, BSHD, BSHD, BSHD)
KIT_ATTENTION_F32_VARIANT(attention_kt_f32, false, BHSD, BHDS, BHSD, BSHD)
KIT_ATTENTION_F32_VARIANT(attention_causal_kt_f32, true, BHSD, BHDS, BHSD, BSHD)

// Packed QKV [b, s, 3, h, d] (GPT-2's c_attn), O [b, s, h, d].
#define KIT_ATTENTION_F32_QKV(NAME, CAUSAL)                                                                           \
  extern "C" __global__ void __launch_bounds__(256, 2)                                                                \
  NAME(const float* __restrict__ qkv, float* __restrict__ o, float scale, int b, int h, int s, int d) {               \
    const long long heads = (long long)h * d;                                                                         \
    attention<CAUSAL, BS3HD, BS3HD, BS3HD, BSHD>(qkv, qkv + heads, qkv + 2 * heads, o, b, h, s, d, 0, scale);         \
  }

KIT_ATTENTION_F32_QKV(attention_qkv_f32, false)
KIT_ATTENTION_F32_QKV(attention_causal_qkv_f32, true)

// Grouped-query attention: Q [b, h, s, d], K and V with g heads, O [b, s, h, d] (_gqa,
// _gqa_bshd) or [b, h, s, d] (_gqa_bhsd).
#define KIT_ATTENTION_F32_GQA(NAME, CAUSAL, KL, VL, OL)                                                               \
  extern "C" __global__ void __launch_bounds__(256, 2)                                                                \
  NAME(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ o,   \
       float scale, int b, int h, int g, int s, int d) {                                                              \
    attention<CAUSAL, BHSD, KL, VL, OL>(q, k, v, o, b, h, s, d, g, scale);                                            \
  }

KIT_ATTENTION_F32_GQA(attention_gqa_f32, false, BHSD, BSHD, BSHD)
KIT_ATTENTION_F32_GQA(attention_causal_gqa_f32, true, BHSD, BSHD, BSHD)
KIT_ATTENTION_F32_GQA(attention_gqa_bshd_f32, false, BSHD, BSHD, BSHD)
KIT_ATTENTION_F32_GQA(attention_causal_gqa_bshd_f32, true, BSHD, BSHD, BSHD)
KIT_ATTENTION_F32_GQA(attention_gqa_bhsd_f32, false, BHSD, BHSD, BHSD)
KIT_ATTENTION_F32_GQA(attention_causal_gqa_bhsd_f32, true, BHSD, BHSD, BHSD)

// Cross-attention (unmasked): Q and O [b, h, s, d], K and V [b, h, t, d].
extern "C" __global__ void __launch_bounds__(256, 2)
attention_cross_f32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ o,
                    float scale, int b, int h, int s, int t, int d) {
  attention<false>(q, k, v, o, b, h, s, d, 0, scale, t);
}

// Key padding: bias [b, t] (f32) added per (batch, key), the softmax scale and the masked value
// (what the causal variants' model adds past the diagonal) as arguments.
#define KIT_ATTENTION_F32_PAD(NAME, CAUSAL, QL, KL, VL, OL)                                                           \
  extern "C" __global__ void __launch_bounds__(256, 2)                                                                \
  NAME(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,                         \
       const float* __restrict__ bias, float* __restrict__ o, float scale, float masked, int b, int h, int s, int d) { \
    attention<CAUSAL, QL, KL, VL, OL, true>(q, k, v, o, b, h, s, d, 0, scale, 0, bias, masked);                      \
  }

KIT_ATTENTION_F32_PAD(attention_pad_f32, false, BHSD, BHSD, BHSD, BHSD)
KIT_ATTENTION_F32_PAD(attention_causal_pad_f32, true, BHSD, BHSD, BHSD, BHSD)
KIT_ATTENTION_F32_PAD(attention_pad_kt_f32, false, BHSD, BHDS, BHSD, BSHD)
KIT_ATTENTION_F32_PAD(attention_causal_pad_kt_f32, true, BHSD, BHDS, BHSD, BSHD)
KIT_ATTENTION_F32_PAD(attention_pad_bshd_f32, false, BSHD, BSHD, BSHD, BSHD)
KIT_ATTENTION_F32_PAD(attention_causal_pad_bshd_f32, true, BSHD, BSHD, BSHD, BSHD)

// Cross-attention with key padding: the _cross layouts, bias [b, t].
extern "C" __global__ void __launch_bounds__(256, 2)
attention_cross_pad_f32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                        const float* __restrict__ bias, float* __restrict__ o, float scale, float masked, int b, int h, int s,
                        int t, int d) {
  attention<false, BHSD, BHSD, BHSD, BHSD, true>(q, k, v, o, b, h, s, d, 0, scale, t, bias, masked);
}

// Grouped-query attention with key padding (Llama called with attention_mask).
#define KIT_ATTENTION_F32_PAD_GQA(NAME, KL)                                                                           \
  extern "C" __global__ void __launch_bounds__(256, 2)                                                                \
  NAME(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,                         \
       const float* __restrict__ bias, float* __restrict__ o, float scale, float masked, int b, int h, int g, int s,   \
       int d) {                                                                                                       \
    attention<true, BHSD, KL, BSHD, BSHD, true>(q, k, v, o, b, h, s, d, g, scale, 0, bias, masked);                  \
  }

KIT_ATTENTION_F32_PAD_GQA(attention_causal_pad_gqa_f32, BHSD)
KIT_ATTENTION_F32_PAD_GQA(attention_causal_pad_gqa_bshd_f32, BSHD)
