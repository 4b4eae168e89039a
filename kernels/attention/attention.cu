// Fused attention forward (flash attention: one pass over K and V with an online softmax):
// O = softmax(Q K^T / sqrt(d)) V per batch and head, Q, K, V, O [b, h, s, d] row-major, f16 or
// bf16, f32 accumulation and softmax; head dims 64 and 128 (others give NaN: loud, not wrong).
// Causal variants mask key j > query i (PyTorch's is_causal, top-left aligned).
// Key-padding variants (_pad) add a bias per (batch, key) [b, t] of E (a model's attention_mask
// as 0 where it attends and the dtype's lowest where it pads) as the model's f16/bf16 chain adds
// it: where the bias is not 0, the score rounded to E, scaled in E, plus the bias in E. Beside an
// attending key a padded one's weight is exp(-65504 - max) = 0, as -inf's; a fully padded row
// gets the softmax over those values, as the model's does (not NaN).
//
// One source, one launch for every GPU: blocks of 384 threads, each owning 128 query rows of
// one head (grid ceildiv(s, 128) x h x b), 98 KB of dynamic shared memory.
//
// sm_80 path (mma.sync.m16n8k16): Q (128 x d) and a double-buffered ring of K and V tiles
// (64 x d) in shared memory, rows of 16-byte chunks XOR-swizzled by row so that ldmatrix reads
// are conflict-free. All 12 warps stream the next K/V tile in with cp.async while warps 0..7
// compute (16 query rows each): S = Q K^T in registers, the running max and sum, P = exp2(S - max)
// re-packed in registers as the A operand of O += P V.

#include "../common/kit_mma.cuh"
#include "../common/kit_sm90.cuh"
#include "layouts.cuh"

namespace {

using kit::half_bits;
using namespace kit_attention;

constexpr int kThreads = 384;
constexpr int BM = 128;  // query rows per block
constexpr int kDynamicSmem = 100352;  // kitdispatch.toml's dynamic_shared_memory
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

struct Problem {
  const half_bits* q;
  const half_bits* k;
  const half_bits* v;
  half_bits* o;
  int s;          // sequence length (queries and keys)
  int q0;         // first query row of this block
  float scale2;   // softmax scale times log2(e): exp(x * scale) = exp2(x * scale2)
  long long q_row, k_row, v_row, o_row;
  int d;          // the head dim (80 and 96 run as 128: zero columns past d, never written)
  int sk;         // keys (s but for cross-attention)  // elements between rows (between keys of K^T's d rows)
  const half_bits* bias = nullptr;  // the key-padding bias of this block's batch row (the _pad variants)
  float scale_e = 0.f;  // the softmax scale rounded to E, and what a causally masked key gets added (padded_score)
  float masked = 0.f;
};

// A value rounded to E (f16 or bf16), as a float.
template <class E>
__device__ __forceinline__ float round_to(float x) {
  return kit::to_float<E>(half_bits(kit::pack2<E>(x, 0.f) & 0xffffu));
}

// A biased key's score in the log2 domain, as the model computes it: Q.K (f32) rounded to E,
// times the scale in E, plus `add` (an E value) in E (f32 holds each E product exactly, and a
// sum of two E values rounds to E as E's own addition does: 24 >= 2 * 11 + 2 bits).
template <class E>
__device__ __forceinline__ float padded_score(float qk, float add, const Problem& p) {
  return round_to<E>(round_to<E>(round_to<E>(qk) * p.scale_e) + add) * kLog2e;
}

// The block's query rows: blocks start in reverse order, so the causal variant's longest rows
// (the last ones) go first and the short ones fill in at the end. K and V have g heads, each
// shared by h / g query heads (g = h: one each; g < h: grouped-query attention).
template <Order QL, Order KL, Order VL, Order OL>
__device__ __forceinline__ Problem block_problem(const half_bits* q, const half_bits* k, const half_bits* v,
                                                 half_bits* o, int h, int g, int s, int d, float scale, int sk) {
  const int q_block = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y, kv_head = head / (h / g);
  return Problem{q + head_offset<QL>(h, head, s, d), k + head_offset<KL>(g, kv_head, sk, d), v + head_offset<VL>(g, kv_head, sk, d),
                 o + head_offset<OL>(h, head, s, d), s, q_block * BM, scale * kLog2e,
                 row_stride<QL>(h, s, d), row_stride<KL>(g, sk, d), row_stride<VL>(g, sk, d), row_stride<OL>(h, s, d), d, sk};
}

// The max of a row over its quad of lanes (each holds a quarter of the row's columns).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(kit::kFullMask, x, 1));
  return fmaxf(x, __shfl_xor_sync(kit::kFullMask, x, 2));
}

// What the online softmax subtracts from a row's scores, given the row's new running max:
// the max, or 0 for a row with every key masked so far (its max stays -inf, and
// exp2(-inf - 0) = 0 where -inf - -inf would be NaN).
__device__ __forceinline__ float max_or_zero(float m) { return m == kit::neg_inf() ? 0.f : m; }

// O's rows row_a and row_a + 8 of a warp's 16, divided by their softmax sums, rounded to E:
// o(j, e) is this lane's accumulator e (0..3) of column tile j (mma/wgmma accumulator layout);
// each row's sum is spread over the row's quad of lanes.
template <class E, int D, class Acc>
__device__ __forceinline__ void write_rows(const Problem& p, int row_a, float l_a, float l_b, int lane, Acc o) {
  l_a += __shfl_xor_sync(kit::kFullMask, l_a, 1);
  l_a += __shfl_xor_sync(kit::kFullMask, l_a, 2);
  l_b += __shfl_xor_sync(kit::kFullMask, l_b, 1);
  l_b += __shfl_xor_sync(kit::kFullMask, l_b, 2);
  const float inv_a = 1.f / l_a, inv_b = 1.f / l_b;
  const int col = lane % 4 * 2, row_b = row_a + 8;
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    if (j * 8 >= p.d) break;  // a head dim padded to D
    if (row_a < p.s)
      *reinterpret_cast<unsigned*>(p.o + row_a * p.o_row + j * 8 + col) = kit::pack2<E>(o(j, 0) * inv_a, o(j, 1) * inv_a);
    if (row_b < p.s)
      *reinterpret_cast<unsigned*>(p.o + row_b * p.o_row + j * 8 + col) = kit::pack2<E>(o(j, 2) * inv_b, o(j, 3) * inv_b);
  }
}

namespace ampere {

constexpr int BN = 64;  // keys per tile
constexpr int kComputeWarps = BM / 16;

// Shared memory in halves: Q, then K[2], then V[2]; each row of D halves is D / 8 16-byte chunks,
// chunk c of row r stored at chunk c ^ (r % 8).
template <int D>
struct Smem {
  static constexpr int kRow = D;
  static constexpr int kQ = 0, kK = BM * D, kV = kK + 2 * BN * D, kHalves = kV + 2 * BN * D;
  static_assert(D / 8 >= 8, "the swizzle permutes 8 chunks");
  static_assert(kHalves * 2 <= kDynamicSmem, "Q and two K/V tiles fit the dynamic shared memory");
  __device__ static int at(int row, int chunk) { return row * kRow + ((chunk ^ (row & 7)) << 3); }
};

// rows [r0, r0 + rows) of an [s, d] matrix whose rows are `stride` elements apart -> shared at
// `dst` as [rows, D], zeros past row s and column d; all threads.
template <int D>
__device__ __forceinline__ void load_rows(half_bits* dst, const half_bits* src, int r0, int rows, int s, long long stride, int d) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < rows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = r0 + r < s && c * 8 < d;  // zeros past the head dim d <= D
    kit::cp_async16(dst + Smem<D>::at(r, c), ok ? src + (r0 + r) * stride + c * 8 : src, ok);
  }
}

// Keys [r0, r0 + rows) of K^T ([D, s], rows `stride` apart) -> shared at `dst` as K's rows,
// zeros past key s; all threads. Element loads, consecutive threads on consecutive keys: a
// K^T row need not be 16-byte aligned (s = 197).
template <int D>
__device__ __forceinline__ void load_transposed(half_bits* dst, const half_bits* src, int r0, int rows, int s, long long stride, int d) {
  for (int i = threadIdx.x; i < rows * D; i += kThreads) {
    const int r = i % rows, e = i / rows;
    const half_bits x = r0 + r < s && e < d ? src[e * stride + r0 + r] : half_bits(0);
    dst[Smem<D>::at(r, e / 8) + e % 8] = x;
  }
}

template <int D, Order KL>
__device__ __forceinline__ void load_keys(half_bits* dst, const Problem& p, int r0) {
  if constexpr (KL == BHDS) {
    load_transposed<D>(dst, p.k, r0, BN, p.sk, p.k_row, p.d);
  } else {
    load_rows<D>(dst, p.k, r0, BN, p.sk, p.k_row, p.d);
  }
}

template <class E, int D, bool kCausal, Order KL, bool kPad = false>
__device__ void block(const Problem& p, half_bits* smem) {
  using L = Smem<D>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Keys past last_key are masked for every row. With padding, a row whose keys 0..i are all
  // padded (left padding) takes the later keys' padded scores too, as the model's softmax does:
  // the block then runs over every key (each adds exp(-65504 - max) = 0 to the other rows).
  const bool every_key = kPad && kCausal && (p.bias[0] & 0x7fffu) != 0;
  const int last_key = kCausal && !every_key ? min(p.sk, p.q0 + BM) : p.sk;
  const int ntiles = (last_key + BN - 1) / BN;

  load_rows<D>(smem + L::kQ, p.q, p.q0, BM, p.s, p.q_row, p.d);
  load_keys<D, KL>(smem + L::kK, p, 0);
  load_rows<D>(smem + L::kV, p.v, 0, BN, p.sk, p.v_row, p.d);
  kit::cp_async_commit();

  const bool computes = warp < kComputeWarps;
  const int row_a = p.q0 + warp * 16 + lane / 4, row_b = row_a + 8;  // this thread's two query rows
  unsigned qf[D / 16][4];
  float o[D / 8][4] = {};
  float m_a = kit::neg_inf(), m_b = kit::neg_inf(), l_a = 0.f, l_b = 0.f;

  for (int t = 0; t < ntiles; ++t) {
    kit::cp_async_wait<0>();
    __syncthreads();  // tile t is in; everyone is done with tile t - 1's buffers
    if (t + 1 < ntiles) {
      const int nb = (t + 1) % 2;
      load_keys<D, KL>(smem + L::kK + nb * BN * D, p, (t + 1) * BN);
      load_rows<D>(smem + L::kV + nb * BN * D, p.v, (t + 1) * BN, BN, p.sk, p.v_row, p.d);
    }
    kit::cp_async_commit();
    if (!computes) continue;
    if (t == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        kit::ldmatrix_x4(qf[kk], smem + L::kQ + L::at(warp * 16 + lane % 16, kk * 2 + lane / 16));
    }
    const half_bits* ks = smem + L::kK + (t % 2) * BN * D;
    const half_bits* vs = smem + L::kV + (t % 2) * BN * D;

    // S = Q K^T: 16 rows x 64 keys, 8 tiles of 16 x 8.
    float sc[BN / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int nt = 0; nt < BN / 8; nt += 2) {
        unsigned r[4];
        kit::ldmatrix_x4(r, ks + L::at(nt * 8 + lane / 16 * 8 + lane % 8, kk * 2 + lane / 8 % 2));
        kit::mma_16x8x16<E>(sc[nt], qf[kk], r[0], r[1]);
        kit::mma_16x8x16<E>(sc[nt + 1], qf[kk], r[2], r[3]);
      }
    }

    // Online softmax over this tile, in the log2 domain.
    const int key0 = t * BN + lane % 4 * 2;
    const bool masked = kPad || t * BN + BN > p.sk || (kCausal && t * BN + BN - 1 > p.q0 + warp * 16);
    float mx_a = m_a, mx_b = m_b;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = sc[nt][e] * p.scale2;
        if (masked) {
          const int key = key0 + nt * 8 + (e & 1), row = e < 2 ? row_a : row_b;
          if (key >= p.sk) {
            x = kit::neg_inf();
          } else if (kPad && kCausal && key > row) {
            x = padded_score<E>(sc[nt][e], p.masked, p);  // the model adds its masked value, not the bias, past the diagonal
          } else if (kPad && (p.bias[key] & 0x7fffu) != 0) {
            x = padded_score<E>(sc[nt][e], kit::to_float<E>(p.bias[key]), p);
          } else if (kCausal && key > row) {
            x = kit::neg_inf();
          }
        }
        sc[nt][e] = x;
        if (e < 2) mx_a = fmaxf(mx_a, x); else mx_b = fmaxf(mx_b, x);
      }
    mx_a = quad_max(mx_a), mx_b = quad_max(mx_b);
    const float ref_a = max_or_zero(mx_a), ref_b = max_or_zero(mx_b);
    const float alpha_a = exp2_approx(m_a - ref_a), alpha_b = exp2_approx(m_b - ref_b);
    m_a = mx_a, m_b = mx_b;
    float sum_a = 0.f, sum_b = 0.f;
    unsigned pf[BN / 16][4];  // P as the A operand of P V: k16 step j = key tiles 2j, 2j + 1
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
      const float p0 = exp2_approx(sc[nt][0] - ref_a), p1 = exp2_approx(sc[nt][1] - ref_a);
      const float p2 = exp2_approx(sc[nt][2] - ref_b), p3 = exp2_approx(sc[nt][3] - ref_b);
      sum_a += p0 + p1, sum_b += p2 + p3;
      pf[nt / 2][(nt % 2) * 2] = kit::pack2<E>(p0, p1);
      pf[nt / 2][(nt % 2) * 2 + 1] = kit::pack2<E>(p2, p3);
    }
    l_a = l_a * alpha_a + sum_a, l_b = l_b * alpha_b + sum_b;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      o[dt][0] *= alpha_a, o[dt][1] *= alpha_a, o[dt][2] *= alpha_b, o[dt][3] *= alpha_b;
    }

    // O += P V: V tile rows are keys (k), columns head dims (n); ldmatrix.trans gives B fragments.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
      for (int dt = 0; dt < D / 8; dt += 2) {
        unsigned r[4];
        kit::ldmatrix_x4_trans(r, vs + L::at(kk * 16 + lane % 16, dt + lane / 16));
        kit::mma_16x8x16<E>(o[dt], pf[kk], r[0], r[1]);
        kit::mma_16x8x16<E>(o[dt + 1], pf[kk], r[2], r[3]);
      }
    }
  }
  if (!computes) return;

  write_rows<E, D>(p, row_a, l_a, l_b, lane, [&](int j, int e) { return o[j][e]; });
}

}  // namespace ampere

// ============================================================ wgmma + TMA path (sm_90a)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace hopper {

using namespace kit::sm90;

constexpr int kStages = 3;              // K/V tiles in flight
constexpr int kStaticBytes = 48 * 1024;  // the part of the layout in a static array

__device__ __align__(128) unsigned char tensor_map_slots[kTensorMapSlots][3][kTensorMapBytes];

// Shared memory: Q (128 x D), then K and V tiles (BN x D) per stage, each as D / 64 boxes of
// 64 columns (128-byte rows, 128-byte swizzle). Byte offsets below 48 KB live in the static
// array, the rest in the dynamic one; every buffer is a multiple of 16 KB, so none straddles.
template <int D>
struct Layout {
  static constexpr int BN = D == 64 ? 128 : 64;  // keys per tile: 16 KB of K and of V either way
  static constexpr int kBoxes = D / 64;
  static constexpr int kQBytes = BM * D * 2, kKVBytes = BN * D * 2;
  static constexpr int kBytes = kQBytes + kStages * 2 * kKVBytes;
  static constexpr int kBarrierOffset = kBytes - kStaticBytes;  // in the dynamic part
  static constexpr int kMapOffset = kBarrierOffset + 128;
  static_assert(kQBytes % 16384 == 0 && kKVBytes == 16384, "buffers do not straddle the static/dynamic seam");
  static_assert(1023 + kMapOffset + 3 * kTensorMapBytes <= kDynamicSmem, "dynamic shared memory layout");
  static_assert(kStaticBytes + kDynamicSmem > 227 * 1024 / 2, "one block per SM (the tensor-map slots rely on it)");

  unsigned stat, dyn;  // shared addresses, 1024-aligned
  unsigned long long* bars;  // q_full, k_full[kStages], v_full[kStages], empty[kStages]
  __device__ unsigned at(int off) const { return off < kStaticBytes ? stat + off : dyn + off - kStaticBytes; }
  __device__ unsigned q() const { return at(0); }
  __device__ unsigned k(int s) const { return at(kQBytes + s * 2 * kKVBytes); }
  __device__ unsigned v(int s) const { return at(kQBytes + s * 2 * kKVBytes + kKVBytes); }
  __device__ unsigned long long* q_full() const { return bars; }
  __device__ unsigned long long* k_full(int s) const { return bars + 1 + s; }
  __device__ unsigned long long* v_full(int s) const { return bars + 1 + kStages + s; }
  __device__ unsigned long long* empty(int s) const { return bars + 1 + 2 * kStages + s; }
};

struct Args {
  int ntiles;
  bool kt_by_threads;  // K^T rows not 16-byte multiples apart (s % 8 != 0): kt_loaders write K's stages
};

// Warps 1-3 of the producer warpgroup, where K^T's rows are not 16-byte multiples apart (ViT's
// s = 197), which TMA cannot take: they write each K stage as TMA would (BN / 64 boxes of D rows
// x 64 keys, 128-byte swizzle), 8 keys a 16-byte store, from 4-byte loads (two elements each,
// realigned with a byte permute where a row's keys start at an odd element), zeros past key s;
// then a proxy fence (wgmma reads through the async proxy) and one arrival each on the stage's
// full barrier.
constexpr int kKtLoaders = 96;
template <int D>
__device__ void kt_loaders(const Layout<D>& L, const Args& a, const Problem& p) {
  using C = Layout<D>;
  constexpr int kChunks = C::BN / 64 * D * 8;  // 16-byte chunks of a K stage
  const int tid = threadIdx.x - 32;
  const unsigned* k32 = reinterpret_cast<const unsigned*>(p.k);
  for (int t = 0; t < a.ntiles; ++t) {
    const int s = t % kStages;
    mbar_wait(L.empty(s), ((t / kStages) & 1) ^ 1);
    for (int u = tid; u < kChunks; u += kKtLoaders) {
      const int c = u % 8, e = u / 8 % D, box = u / (8 * D);
      const int key0 = t * C::BN + box * 64 + c * 8;
      const long long off = e * p.k_row + key0;  // element index of (row e, key key0) in this head's K^T
      unsigned w[4];
      if (key0 + 8 < p.s && e < p.d) {
        if ((off & 1) == 0) {
#pragma unroll
          for (int j = 0; j < 4; ++j) w[j] = k32[off / 2 + j];
        } else {
          unsigned x = k32[off / 2];  // elements off - 1, off
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const unsigned y = k32[off / 2 + 1 + j];
            w[j] = __byte_perm(x, y, 0x5432);  // x's high element, y's low one
            x = y;
          }
        }
      } else {  // the last keys: element by element, zeros past s (and past the head dim d)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const unsigned lo = key0 + 2 * j < p.s && e < p.d ? p.k[off + 2 * j] : 0u;
          const unsigned hi = key0 + 2 * j + 1 < p.s && e < p.d ? p.k[off + 2 * j + 1] : 0u;
          w[j] = lo | hi << 16;
        }
      }
      const unsigned dst = L.k(s) + box * D * 128 + e * 128 + ((c ^ (e % 8)) * 16);
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                   : "memory");
    }
    fence_proxy_async();
    mbar_arrive(L.k_full(s));
  }
}

// Warp 0 of the producer warpgroup: builds the Q, K and V maps, then (lane 0) loads Q once and
// keeps the K/V ring full. Each map is of this block's head alone ([s, d], rows the layout's
// row stride apart: [b, h, s, d] and [b, s, h, d] alike, and a query head's K/V head under GQA).
// kKT: K arrives as K^T [d, s] (keys contiguous), loaded as BN / 64 boxes of d rows x 64 keys.
template <class E, int D, bool kKT>
__device__ void produce(const Layout<D>& L, const Args& a, const Problem& p, unsigned maps, unsigned char (*slot)[kTensorMapBytes]) {
  using C = Layout<D>;
  const int lane = threadIdx.x % 32;
  const bool k_by_tma = !(kKT && a.kt_by_threads);
  if (lane == 0) {
    tensor_map_3d<E>(maps, p.q, D, p.s, 1, 64, BM, p.q_row);
    if (kKT) {  // (a map of rows that are not 16-byte multiples apart is written, never used)
      tensor_map_3d<E>(maps + kTensorMapBytes, p.k, p.s, D, 1, 64, D, p.k_row);
    } else {
      tensor_map_3d<E>(maps + kTensorMapBytes, p.k, D, p.s, 1, 64, C::BN, p.k_row);
    }
    tensor_map_3d<E>(maps + 2 * kTensorMapBytes, p.v, D, p.s, 1, 64, C::BN, p.v_row);
  }
  __syncwarp();
  for (int i = 0; i < 3; ++i) tensor_map_publish(slot[i], maps + i * kTensorMapBytes);
  if (lane != 0) return;
  for (int i = 0; i < 3; ++i) tensor_map_acquire(slot[i]);
  mbar_arrive_expect_tx(L.q_full(), C::kQBytes);
  for (int i = 0; i < C::kBoxes; ++i) tma_load_3d(L.q() + i * BM * 128, slot[0], 64 * i, p.q0, 0, L.q_full());
  for (int t = 0; t < a.ntiles; ++t) {
    const int s = t % kStages;
    mbar_wait(L.empty(s), ((t / kStages) & 1) ^ 1);  // the first pass finds every stage free
    if (k_by_tma) {  // (else kt_loaders write K)
      mbar_arrive_expect_tx(L.k_full(s), C::kKVBytes);
      if (kKT) {
        for (int i = 0; i < C::BN / 64; ++i) tma_load_3d(L.k(s) + i * D * 128, slot[1], t * C::BN + 64 * i, 0, 0, L.k_full(s));
      } else {
        for (int i = 0; i < C::kBoxes; ++i) tma_load_3d(L.k(s) + i * C::BN * 128, slot[1], 64 * i, t * C::BN, 0, L.k_full(s));
      }
    }
    mbar_arrive_expect_tx(L.v_full(s), C::kKVBytes);
    for (int i = 0; i < C::kBoxes; ++i) tma_load_3d(L.v(s) + i * C::BN * 128, slot[2], 64 * i, t * C::BN, 0, L.v_full(s));
  }
}

// Consumer warpgroup `wg` (0 or 1): query rows 64 * wg .. + 64 of the block.
template <class E, int D, bool kCausal, bool kKT>
__device__ void consume(const Layout<D>& L, const Args& a, const Problem& p, int wg) {
  using C = Layout<D>;
  constexpr int BN = C::BN;
  const int t_in_wg = threadIdx.x % 128, warp = t_in_wg / 32, lane = t_in_wg % 32;
  const int first_row = p.q0 + wg * 64 + warp * 16;  // of this warp
  const int row_a = first_row + lane / 4, row_b = row_a + 8;
  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float m_a = kit::neg_inf(), m_b = kit::neg_inf(), l_a = 0.f, l_b = 0.f;
  mbar_wait(L.q_full(), 0);
  const unsigned q = L.q() + wg * 64 * 128;
  for (int t = 0; t < a.ntiles; ++t) {
    const int s = t % kStages;
    const unsigned parity = (t / kStages) & 1;
    // S = Q K^T (64 x BN): A = Q, K-major (head dim contiguous); B = K, K-major, or K^T, N-major
    // (keys contiguous: 16 of its d rows a step, boxes of 64 keys D rows apart, as V's columns).
    float sc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) sc[i] = 0.f;
    mbar_wait(L.k_full(s), parity);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const unsigned box = kk / 4, col = kk % 4 * 32;
      if constexpr (kKT) {
        wgmma_ss<E, BN, 1>(sc, smem_desc_sw128(q + box * BM * 128 + col, 16, 1024),
                           smem_desc_sw128(L.k(s) + kk * 16 * 128, D * 128, 1024));
      } else {
        wgmma_ss<E, BN, 0>(sc, smem_desc_sw128(q + box * BM * 128 + col, 16, 1024),
                           smem_desc_sw128(L.k(s) + box * BN * 128 + col, 16, 1024));
      }
    }
    wgmma_commit();
    wgmma_wait<0>();

    // Online softmax over the tile, in the log2 domain.
    const int key0 = t * BN + lane % 4 * 2;
    const bool masked = t * BN + BN > p.s || (kCausal && t * BN + BN - 1 > first_row);
    float mx_a = m_a, mx_b = m_b;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) {
      float x = sc[i] * p.scale2;
      if (masked) {
        const int key = key0 + i / 4 * 8 + (i & 1), row = (i & 2) ? row_b : row_a;
        if (key >= p.s || (kCausal && key > row)) x = kit::neg_inf();
      }
      sc[i] = x;
      if (i & 2) mx_b = fmaxf(mx_b, x); else mx_a = fmaxf(mx_a, x);
    }
    mx_a = quad_max(mx_a), mx_b = quad_max(mx_b);
    const float ref_a = max_or_zero(mx_a), ref_b = max_or_zero(mx_b);
    const float alpha_a = exp2_approx(m_a - ref_a), alpha_b = exp2_approx(m_b - ref_b);
    m_a = mx_a, m_b = mx_b;
    float sum_a = 0.f, sum_b = 0.f;
    unsigned pf[BN / 16][4];  // P as the A operand of P V (mma.sync's A fragment, per warp)
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const float p0 = exp2_approx(sc[4 * j] - ref_a), p1 = exp2_approx(sc[4 * j + 1] - ref_a);
      const float p2 = exp2_approx(sc[4 * j + 2] - ref_b), p3 = exp2_approx(sc[4 * j + 3] - ref_b);
      sum_a += p0 + p1, sum_b += p2 + p3;
      pf[j / 2][(j % 2) * 2] = kit::pack2<E>(p0, p1);
      pf[j / 2][(j % 2) * 2 + 1] = kit::pack2<E>(p2, p3);
    }
    l_a = l_a * alpha_a + sum_a, l_b = l_b * alpha_b + sum_b;
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] *= (i & 2) ? alpha_b : alpha_a;

    // O += P V: B = V, N-major (head dim contiguous), 64-column boxes BN rows apart.
    mbar_wait(L.v_full(s), parity);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
      wgmma_rs<E, D, 1>(o, pf[kk], smem_desc_sw128(L.v(s) + kk * 16 * 128, BN * 128, 1024));
    wgmma_commit();
    wgmma_wait<0>();
    if (t_in_wg == 0) mbar_arrive(L.empty(s));
  }

  write_rows<E, D>(p, row_a, l_a, l_b, lane, [&](int j, int e) { return o[4 * j + e]; });
}

template <class E, int D, bool kCausal, bool kKT>
__device__ void block(const Problem& p, Args a, unsigned stat, char* dyn_smem) {
  using C = Layout<D>;
  const unsigned dyn = (kit::smem_addr(dyn_smem) + 1023) & ~1023u;
  char* dyn_aligned = dyn_smem + (dyn - kit::smem_addr(dyn_smem));
  const C L{stat, dyn, reinterpret_cast<unsigned long long*>(dyn_aligned + C::kBarrierOffset)};
  const int last_key = kCausal ? min(p.s, p.q0 + BM) : p.s;
  a.ntiles = (last_key + C::BN - 1) / C::BN;
  if (threadIdx.x == 0) {
    mbar_init(L.q_full(), 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(L.k_full(s), kKT && a.kt_by_threads ? kKtLoaders : 1);
      mbar_init(L.v_full(s), 1);
      mbar_init(L.empty(s), 2);  // one arrival per consumer warpgroup
    }
    mbar_init_fence();
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x < 32) {
      produce<E, D, kKT>(L, a, p, dyn + C::kMapOffset, tensor_map_slots[sm_id()]);
    } else if (kKT && a.kt_by_threads) {
      kt_loaders<D>(L, a, p);
    }
  } else {
    setmaxnreg_inc<232>();
    consume<E, D, kCausal, kKT>(L, a, p, wg - 1);
  }
}

}  // namespace hopper
#endif

// Rows of the block's output as NaN: head dims the kernel has no code for, misaligned tensors.
__device__ void fill_nan(const Problem& p, int d) {
  for (int i = threadIdx.x; i < BM * d; i += kThreads) {
    const int r = p.q0 + i / d;
    if (r < p.s) p.o[r * p.o_row + i % d] = 0x7fff;  // a NaN in f16 and in bf16
  }
}

// On sm_90a the wgmma + TMA path takes Q, K and V in [b, h, s, d] or [b, s, h, d] (GQA too) with
// O in any layout from kHopperMinKeys keys: below that its fixed cost (tensor maps built on the
// device, the pipeline's fill) outweighs its speed and the mma.sync path is faster. K as K^T
// [b, h, d, s] takes it at any length (its mma.sync path is slower): by TMA where s is a multiple
// of 8, else written by the producer's other warps (kt_loaders; H200, ViT's s = 197: b8 h12 d64
// 29.3 -> 20.2 us, b1 14.9 -> 10.5; benchmarks/results/attention-kt-threads-h200-round32.txt).
// Cross-attention, key padding (_pad) and misaligned tensors take the mma.sync path, as every
// other GPU does. H100 device time (benchmarks/results/attention-layouts-h100-round29.txt): b8
// h12 s512 d64 [b, s, h, d] 62.3 (mma.sync) -> 47.7 us, GQA 67.0 -> 49.1, K^T 122.8 -> 41.5;
// b1 h12 s128 d64 [b, h, s, d] 13.4 (wgmma) -> 10.1 (mma.sync), K^T 14.8 -> 9.7 (wgmma).
constexpr int kHopperMinKeys = 257;
template <class E, bool kCausal, Order QL = BHSD, Order KL = BHSD, Order VL = BHSD, Order OL = BHSD, bool kPad = false>
__device__ __forceinline__ void attention(const half_bits* q, const half_bits* k, const half_bits* v, half_bits* o,
                                          int b, int h, int s, int d, int g = 0, float scale = 0.f, int t = 0,
                                          const half_bits* bias = nullptr, float masked = 0.f) {
  extern __shared__ __align__(1024) char dyn_smem[];
  const bool grouped = g > 0 && g != h;
  const float softmax_scale = scale > 0.f ? scale : rsqrtf(float(d));  // the op's, where the entry takes it
  const int keys = t > 0 ? t : s;  // cross-attention: t keys for s queries
  Problem p = block_problem<QL, KL, VL, OL>(q, k, v, o, h, grouped && h % g == 0 ? g : h, s, d, softmax_scale, keys);
  if (kPad) p.bias = bias + (long long)blockIdx.z * keys, p.scale_e = round_to<E>(softmax_scale), p.masked = round_to<E>(masked);
  if (grouped && h % g != 0) {  // query heads not a multiple of K/V heads: loud, not wrong
    fill_nan(p, d);
    return;
  }
  half_bits* smem = reinterpret_cast<half_bits*>(dyn_smem);
  const bool aligned = kit::aligned16(q) && kit::aligned16(k) && kit::aligned16(v) && kit::aligned16(o);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kRows = QL != BHDS && VL != BHDS && !kPad;  // K may be K^T (its keys contiguous)
  __shared__ __align__(1024) char stat[hopper::kStaticBytes];
  const unsigned stat_addr = kit::smem_addr(stat);
  // K^T whose rows are not 16-byte multiples apart (TMA's) is written by the producer's other warps
  const bool kt_by_threads = KL == BHDS && p.k_row % 8 != 0;
  if (kRows && keys == s && (KL == BHDS || s >= kHopperMinKeys) && aligned && (d == 64 || d == 128) && hopper::sm_id() < hopper::kTensorMapSlots && (stat_addr & 1023) == 0) {
    const hopper::Args a{0, kt_by_threads};
    if (d == 128) {
      hopper::block<E, 128, kCausal, KL == BHDS>(p, a, stat_addr, dyn_smem);
    } else {
      hopper::block<E, 64, kCausal, KL == BHDS>(p, a, stat_addr, dyn_smem);
    }
    return;
  }
#endif
  if (aligned && (d == 128 || d == 96 || d == 80)) {  // 80 and 96 padded to 128 in shared memory and registers
    ampere::block<E, 128, kCausal, KL, kPad>(p, smem);
  } else if (aligned && d == 64) {
    ampere::block<E, 64, kCausal, KL, kPad>(p, smem);
  } else {
    fill_nan(p, d);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(384, 1)
attention_f16(const half_bits* __restrict__ q, const half_bits* __restrict__ k, const half_bits* __restrict__ v,
              half_bits* __restrict__ o, int b, int h, int s, int d) {
  attention<kit::F16, false>(q, k, v, o, b, h, s, d);
}

extern "C" __global__ void __launch_bounds__(384, 1)
attention_causal_f16(const half_bits* __restrict__ q, const half_bits* __restrict__ k, const half_bits* __restrict__ v,
                     half_bits* __restrict__ o, int b, int h, int s, int d) {
  attention<kit::F16, true>(q, k, v, o, b, h, s, d);
}

extern "C" __global__ void __launch_bounds__(384, 1)
attention_bf16(const half_bits* __restrict__ q, const half_bits* __restrict__ k, const half_bits* __restrict__ v,
               half_bits* __restrict__ o, int b, int h, int s, int d) {
  attention<kit::BF16, false>(q, k, v, o, b, h, s, d);
}

extern "C" __global__ void __launch_bounds__(384, 1)
attention_causal_bf16(const half_bits* __restrict__ q, const half_bits* __restrict__ k, const half_bits* __restrict__ v,
                      half_bits* __restrict__ o, int b, int h, int s, int d) {
  attention<kit::BF16, true>(q, k, v, o, b, h, s, d);
}

// Layout variants (mma.sync path): what exporters' projected attention leaves.
// _bshd: Q, K, V and O [b, s, h, d] (GPT-2's split of one QKV projection, the heads never
// transposed); _kt: Q and V [b, h, s, d], K^T [b, h, d, s], O [b, s, h, d] (BERT, ViT: the
// projections' transposes keep their bias adds, the output's transpose goes). The softmax scale
// is an argument (the op's constant: f16 models scale by 1/sqrt(d) rounded to f16).
#define KIT_ATTENTION_VARIANT(NAME, E, CAUSAL, QL, KL, VL, OL)                                                        \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                                \
  NAME(const half_bits* __restrict__ q, const half_bits* __restrict__ k, const half_bits* __restrict__ v,             \
       half_bits* __restrict__ o, float scale, int b, int h, int s, int d) {                                          \
    attention<E, CAUSAL, QL, KL, VL, OL>(q, k, v, o, b, h, s, d, 0, scale);                                          \
  }

KIT_ATTENTION_VARIANT(attention_bshd_f16, kit::F16, false, BSHD, BSHD, BSHD, BSHD)
KIT_ATTENTION_VARIANT(attention_causal_bshd_f16, kit::F16, true, BSHD, BSHD, BSHD, BSHD)
KIT_ATTENTION_VARIANT(attention_kt_f16, kit::F16, false, BHSD, BHDS, BHSD, BSHD)
KIT_ATTENTION_VARIANT(attention_causal_kt_f16, kit::F16, true, BHSD, BHDS, BHSD, BSHD)
KIT_ATTENTION_VARIANT(attention_bshd_bf16, kit::BF16, false, BSHD, BSHD, BSHD, BSHD)
KIT_ATTENTION_VARIANT(attention_causal_bshd_bf16, kit::BF16, true, BSHD, BSHD, BSHD, BSHD)
KIT_ATTENTION_VARIANT(attention_kt_bf16, kit::BF16, false, BHSD, BHDS, BHSD, BSHD)
KIT_ATTENTION_VARIANT(attention_causal_kt_bf16, kit::BF16, true, BHSD, BHDS, BHSD, BSHD)

// Packed QKV (GPT-2's one c_attn projection, read in place instead of as three copied slices):
// qkv [b, s, 3, h, d] (Q, K, V each [b, s, h, d] with rows 3 * h * d apart), O [b, s, h, d]. The
// same paths and choice rules as _bshd (the wgmma + TMA path from kHopperMinKeys keys: its tensor
// maps take the 3 * h * d row stride; K and V stay 16-byte aligned where h * d is a multiple of 8).
#define KIT_ATTENTION_QKV(NAME, E, CAUSAL)                                                                            \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                                \
  NAME(const half_bits* __restrict__ qkv, half_bits* __restrict__ o, float scale, int b, int h, int s, int d) {       \
    const long long heads = (long long)h * d;                                                                         \
    attention<E, CAUSAL, BS3HD, BS3HD, BS3HD, BSHD>(qkv, qkv + heads, qkv + 2 * heads, o, b, h, s, d, 0, scale);      \
  }

KIT_ATTENTION_QKV(attention_qkv_f16, kit::F16, false)
KIT_ATTENTION_QKV(attention_causal_qkv_f16, kit::F16, true)
KIT_ATTENTION_QKV(attention_qkv_bf16, kit::BF16, false)
KIT_ATTENTION_QKV(attention_causal_qkv_bf16, kit::BF16, true)

// Grouped-query attention (Llama's GQA as the dynamo exporter leaves it): Q [b, h, s, d], K
// [b, g, s, d] (after RoPE), V [b, s, g, d] (its projection's heads), O [b, s, h, d]; query head
// i reads K and V head i / (h / g). The softmax scale is an argument (the op's constant: f16
// models scale by 1/sqrt(d) rounded to f16).
#define KIT_ATTENTION_GQA(NAME, E, CAUSAL, KL, VL, OL)                                                                \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                                \
  NAME(const half_bits* __restrict__ q, const half_bits* __restrict__ k, const half_bits* __restrict__ v,             \
       half_bits* __restrict__ o, float scale, int b, int h, int g, int s, int d) {                                   \
    attention<E, CAUSAL, BHSD, KL, VL, OL>(q, k, v, o, b, h, s, d, g, scale);                                         \
  }

// _gqa: K [b, g, s, d] (Llama's K, materialized by RoPE); _gqa_bshd: K [b, s, g, d] (its projection's heads).
KIT_ATTENTION_GQA(attention_gqa_f16, kit::F16, false, BHSD, BSHD, BSHD)
KIT_ATTENTION_GQA(attention_causal_gqa_f16, kit::F16, true, BHSD, BSHD, BSHD)
KIT_ATTENTION_GQA(attention_gqa_bf16, kit::BF16, false, BHSD, BSHD, BSHD)
KIT_ATTENTION_GQA(attention_causal_gqa_bf16, kit::BF16, true, BHSD, BSHD, BSHD)
KIT_ATTENTION_GQA(attention_gqa_bshd_f16, kit::F16, false, BSHD, BSHD, BSHD)
KIT_ATTENTION_GQA(attention_causal_gqa_bshd_f16, kit::F16, true, BSHD, BSHD, BSHD)
KIT_ATTENTION_GQA(attention_gqa_bshd_bf16, kit::BF16, false, BSHD, BSHD, BSHD)
KIT_ATTENTION_GQA(attention_causal_gqa_bshd_bf16, kit::BF16, true, BSHD, BSHD, BSHD)
// _gqa_bhsd: every tensor [b, ., s, d] (SDPA's enable_gqa: Q and O [b, h, s, d], K and V [b, g, s, d]).
KIT_ATTENTION_GQA(attention_gqa_bhsd_f16, kit::F16, false, BHSD, BHSD, BHSD)
KIT_ATTENTION_GQA(attention_causal_gqa_bhsd_f16, kit::F16, true, BHSD, BHSD, BHSD)
KIT_ATTENTION_GQA(attention_gqa_bhsd_bf16, kit::BF16, false, BHSD, BHSD, BHSD)
KIT_ATTENTION_GQA(attention_causal_gqa_bhsd_bf16, kit::BF16, true, BHSD, BHSD, BHSD)

// Cross-attention (unmasked): Q and O [b, h, s, d], K and V [b, h, t, d], t keys of another sequence.
#define KIT_ATTENTION_CROSS(NAME, E)                                                                                  \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                                \
  NAME(const half_bits* __restrict__ q, const half_bits* __restrict__ k, const half_bits* __restrict__ v,             \
       half_bits* __restrict__ o, float scale, int b, int h, int s, int t, int d) {                                   \
    attention<E, false>(q, k, v, o, b, h, s, d, 0, scale, t);                                                        \
  }

KIT_ATTENTION_CROSS(attention_cross_f16, kit::F16)
KIT_ATTENTION_CROSS(attention_cross_bf16, kit::BF16)

// Cross-attention with key padding (an encoder's attention_mask on the keys a decoder attends
// to): the _cross layouts and the bias [b, t] / masked arguments of the _pad entries.
#define KIT_ATTENTION_CROSS_PAD(NAME, E)                                                                              \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                                \
  NAME(const half_bits* __restrict__ q, const half_bits* __restrict__ k, const half_bits* __restrict__ v,             \
       const half_bits* __restrict__ bias, half_bits* __restrict__ o, float scale, float masked, int b, int h,       \
       int s, int t, int d) {                                                                                         \
    attention<E, false, BHSD, BHSD, BHSD, BHSD, true>(q, k, v, o, b, h, s, d, 0, scale, t, bias, masked);            \
  }

KIT_ATTENTION_CROSS_PAD(attention_cross_pad_f16, kit::F16)
KIT_ATTENTION_CROSS_PAD(attention_cross_pad_bf16, kit::BF16)

// Key padding (mma.sync path): bias [b, t] of E added per (batch, key), the softmax scale and
// the masked value (what the causal variants' model adds past the diagonal: HF's lowest) as
// arguments. Layouts as above: _pad [b, h, s, d] throughout; _pad_kt BERT's; _pad_bshd GPT-2's.
#define KIT_ATTENTION_PAD(NAME, E, CAUSAL, QL, KL, VL, OL)                                                            \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                                \
  NAME(const half_bits* __restrict__ q, const half_bits* __restrict__ k, const half_bits* __restrict__ v,             \
       const half_bits* __restrict__ bias, half_bits* __restrict__ o, float scale, float masked, int b, int h,       \
       int s, int d) {                                                                                                \
    attention<E, CAUSAL, QL, KL, VL, OL, true>(q, k, v, o, b, h, s, d, 0, scale, 0, bias, masked);                   \
  }

KIT_ATTENTION_PAD(attention_pad_f16, kit::F16, false, BHSD, BHSD, BHSD, BHSD)
KIT_ATTENTION_PAD(attention_causal_pad_f16, kit::F16, true, BHSD, BHSD, BHSD, BHSD)
KIT_ATTENTION_PAD(attention_pad_kt_f16, kit::F16, false, BHSD, BHDS, BHSD, BSHD)
KIT_ATTENTION_PAD(attention_causal_pad_kt_f16, kit::F16, true, BHSD, BHDS, BHSD, BSHD)
KIT_ATTENTION_PAD(attention_pad_bshd_f16, kit::F16, false, BSHD, BSHD, BSHD, BSHD)
KIT_ATTENTION_PAD(attention_causal_pad_bshd_f16, kit::F16, true, BSHD, BSHD, BSHD, BSHD)
KIT_ATTENTION_PAD(attention_pad_bf16, kit::BF16, false, BHSD, BHSD, BHSD, BHSD)
KIT_ATTENTION_PAD(attention_causal_pad_bf16, kit::BF16, true, BHSD, BHSD, BHSD, BHSD)
KIT_ATTENTION_PAD(attention_pad_kt_bf16, kit::BF16, false, BHSD, BHDS, BHSD, BSHD)
KIT_ATTENTION_PAD(attention_causal_pad_kt_bf16, kit::BF16, true, BHSD, BHDS, BHSD, BSHD)
KIT_ATTENTION_PAD(attention_pad_bshd_bf16, kit::BF16, false, BSHD, BSHD, BSHD, BSHD)
KIT_ATTENTION_PAD(attention_causal_pad_bshd_bf16, kit::BF16, true, BSHD, BSHD, BSHD, BSHD)

// Grouped-query attention with key padding (Llama called with attention_mask): the _gqa layouts
// above and the bias / masked arguments of the _pad entries.
#define KIT_ATTENTION_PAD_GQA(NAME, E, CAUSAL, KL)                                                                    \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                                \
  NAME(const half_bits* __restrict__ q, const half_bits* __restrict__ k, const half_bits* __restrict__ v,             \
       const half_bits* __restrict__ bias, half_bits* __restrict__ o, float scale, float masked, int b, int h, int g, \
       int s, int d) {                                                                                                \
    attention<E, CAUSAL, BHSD, KL, BSHD, BSHD, true>(q, k, v, o, b, h, s, d, g, scale, 0, bias, masked);             \
  }

KIT_ATTENTION_PAD_GQA(attention_causal_pad_gqa_f16, kit::F16, true, BHSD)
KIT_ATTENTION_PAD_GQA(attention_causal_pad_gqa_bf16, kit::BF16, true, BHSD)
KIT_ATTENTION_PAD_GQA(attention_causal_pad_gqa_bshd_f16, kit::F16, true, BSHD)
KIT_ATTENTION_PAD_GQA(attention_causal_pad_gqa_bshd_bf16, kit::BF16, true, BSHD)
