// Fused attention forward (flash attention: one pass over K and V with an online softmax):
// O = softmax(Q K^T / sqrt(d)) V per batch and head, Q, K, V, O [b, h, s, d] row-major, f16 or
// bf16, f32 accumulation and softmax; head dims 64 and 128 (others give NaN: loud, not wrong).
// Causal variants mask key j > query i (PyTorch's is_causal, top-left aligned).
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

namespace {

using kit::half_bits;

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
};

// The block's query rows: blocks start in reverse order, so the causal variant's longest rows
// (the last ones) go first and the short ones fill in at the end.
__device__ __forceinline__ Problem block_problem(const half_bits* q, const half_bits* k, const half_bits* v,
                                                 half_bits* o, int h, int s, int d) {
  const long long head = (long long)blockIdx.z * h + blockIdx.y;
  const long long off = head * s * d;
  const int q_block = gridDim.x - 1 - blockIdx.x;
  return Problem{q + off, k + off, v + off, o + off, s, q_block * BM, rsqrtf(float(d)) * kLog2e};
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
  __device__ static int at(int row, int chunk) { return row * kRow + ((chunk ^ (row & 7)) << 3); }
};
static_assert(Smem<128>::kHalves * 2 <= kDynamicSmem, "Q and two K/V tiles fit the dynamic shared memory");

// rows [r0, r0 + rows) of a [s, D] matrix -> shared at `dst`, zeros past row s; all threads.
template <int D>
__device__ __forceinline__ void load_rows(half_bits* dst, const half_bits* src, int r0, int rows, int s) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < rows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = r0 + r < s;
    kit::cp_async16(dst + Smem<D>::at(r, c), ok ? src + (long long)(r0 + r) * D + c * 8 : src, ok);
  }
}

template <class E, int D, bool kCausal>
__device__ void block(const Problem& p, half_bits* smem) {
  using L = Smem<D>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int last_key = kCausal ? min(p.s, p.q0 + BM) : p.s;  // keys past it are masked for every row
  const int ntiles = (last_key + BN - 1) / BN;

  load_rows<D>(smem + L::kQ, p.q, p.q0, BM, p.s);
  load_rows<D>(smem + L::kK, p.k, 0, BN, p.s);
  load_rows<D>(smem + L::kV, p.v, 0, BN, p.s);
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
      load_rows<D>(smem + L::kK + nb * BN * D, p.k, (t + 1) * BN, BN, p.s);
      load_rows<D>(smem + L::kV + nb * BN * D, p.v, (t + 1) * BN, BN, p.s);
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
    const bool masked = t * BN + BN > p.s || (kCausal && t * BN + BN - 1 > p.q0 + warp * 16);
    float mx_a = m_a, mx_b = m_b;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = sc[nt][e] * p.scale2;
        if (masked) {
          const int key = key0 + nt * 8 + (e & 1), row = e < 2 ? row_a : row_b;
          if (key >= p.s || (kCausal && key > row)) x = kit::neg_inf();
        }
        sc[nt][e] = x;
        if (e < 2) mx_a = fmaxf(mx_a, x); else mx_b = fmaxf(mx_b, x);
      }
    mx_a = fmaxf(mx_a, __shfl_xor_sync(kit::kFullMask, mx_a, 1));
    mx_a = fmaxf(mx_a, __shfl_xor_sync(kit::kFullMask, mx_a, 2));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(kit::kFullMask, mx_b, 1));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(kit::kFullMask, mx_b, 2));
    // A row with every key masked so far keeps max -inf: subtract 0 instead (p = 0, no NaN).
    const float ref_a = mx_a == kit::neg_inf() ? 0.f : mx_a, ref_b = mx_b == kit::neg_inf() ? 0.f : mx_b;
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

  // Each row's sum is spread over its quad of lanes.
  l_a += __shfl_xor_sync(kit::kFullMask, l_a, 1);
  l_a += __shfl_xor_sync(kit::kFullMask, l_a, 2);
  l_b += __shfl_xor_sync(kit::kFullMask, l_b, 1);
  l_b += __shfl_xor_sync(kit::kFullMask, l_b, 2);
  const float inv_a = 1.f / l_a, inv_b = 1.f / l_b;
  const int col = lane % 4 * 2;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    if (row_a < p.s)
      *reinterpret_cast<unsigned*>(p.o + (long long)row_a * D + dt * 8 + col) =
          kit::pack2<E>(o[dt][0] * inv_a, o[dt][1] * inv_a);
    if (row_b < p.s)
      *reinterpret_cast<unsigned*>(p.o + (long long)row_b * D + dt * 8 + col) =
          kit::pack2<E>(o[dt][2] * inv_b, o[dt][3] * inv_b);
  }
}

}  // namespace ampere

// Rows of the block's output as NaN: head dims the kernel has no code for, misaligned tensors.
__device__ void fill_nan(const Problem& p, int d) {
  for (int i = threadIdx.x; i < BM * d; i += kThreads) {
    const int r = p.q0 + i / d;
    if (r < p.s) p.o[(long long)r * d + i % d] = 0x7fff;  // a NaN in f16 and in bf16
  }
}

template <class E, bool kCausal>
__device__ __forceinline__ void attention(const half_bits* q, const half_bits* k, const half_bits* v, half_bits* o,
                                          int h, int s, int d) {
  extern __shared__ __align__(1024) char dyn_smem[];
  const Problem p = block_problem(q, k, v, o, h, s, d);
  half_bits* smem = reinterpret_cast<half_bits*>(dyn_smem);
  const bool aligned = kit::aligned16(q) && kit::aligned16(k) && kit::aligned16(v) && kit::aligned16(o);
  if (aligned && d == 128) {
    ampere::block<E, 128, kCausal>(p, smem);
  } else if (aligned && d == 64) {
    ampere::block<E, 64, kCausal>(p, smem);
  } else {
    fill_nan(p, d);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(384, 1)
attention_f16(const half_bits* __restrict__ q, const half_bits* __restrict__ k, const half_bits* __restrict__ v,
              half_bits* __restrict__ o, int b, int h, int s, int d) {
  attention<kit::F16, false>(q, k, v, o, h, s, d);
}

extern "C" __global__ void __launch_bounds__(384, 1)
attention_causal_f16(const half_bits* __restrict__ q, const half_bits* __restrict__ k, const half_bits* __restrict__ v,
                     half_bits* __restrict__ o, int b, int h, int s, int d) {
  attention<kit::F16, true>(q, k, v, o, h, s, d);
}

extern "C" __global__ void __launch_bounds__(384, 1)
attention_bf16(const half_bits* __restrict__ q, const half_bits* __restrict__ k, const half_bits* __restrict__ v,
               half_bits* __restrict__ o, int b, int h, int s, int d) {
  attention<kit::BF16, false>(q, k, v, o, h, s, d);
}

extern "C" __global__ void __launch_bounds__(384, 1)
attention_causal_bf16(const half_bits* __restrict__ q, const half_bits* __restrict__ k, const half_bits* __restrict__ v,
                      half_bits* __restrict__ o, int b, int h, int s, int d) {
  attention<kit::BF16, true>(q, k, v, o, h, s, d);
}
