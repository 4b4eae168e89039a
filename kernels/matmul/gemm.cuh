// The library GEMM template behind matmul_nn_*, matmul_nt_*, bmm_nn_*, bmm_nt_* (generated entry
// files matmul_nn.cu, matmul_nt.cu, bmm.cu; gen_manifest.py writes them and kitdispatch.toml).
//
//   C[b, m, n] = epilogue( sum_k A[b, m, k] * B'[b, k, n] )   f32 accumulation
//   NN: B is [b, k, n] row-major (B' = B);  NT: B is [b, n, k] row-major (B' = B^T, nn.Linear's
//   weight W[n, k]).  b = 0 .. batch-1 with contiguous (strided by m*k, k*n, m*n) batches;
//   the plain matmuls are batch 1.
//
// Launch: 384 threads (288 for R = 2), grid (ceildiv(n, BN), ceildiv(m, TM), batch * S), the
// manifest's dynamic shared memory (kDynamicSmem: 183296 bytes on sm_90a, 100352 elsewhere).
// Template parameters:
//   E     input element type (kit::F16 / kit::BF16)
//   Out   result type (kit::F16 / kit::BF16 / kit::F32); bias and residual have this type too
//   kNT   B layout
//   BN    tile width: 256, 128 or 64 (the tile is TM x BN)
//   S     split-K factor: 1, 2 or 4. On sm_90a the S CTAs of a K split are one thread-block
//         cluster (__cluster_dims__(1, 1, S)): each computes a contiguous share of the k slices
//         into its own f32 staging tile in shared memory; after a cluster barrier CTA r sums rows
//         [r * TM / S, (r + 1) * TM / S) of all S tiles, applies the epilogue and stores. S = 2
//         reads the other tile through distributed shared memory; S >= 4 has each CTA write the
//         rows other CTAs own to its SM's slot of a global f32 buffer first (hopper::splitk_slots,
//         one slot per SM id like the tensor-map slots: one such CTA per SM, so concurrent
//         launches cannot collide) and the owners read them through L2: distributed shared memory
//         moves about 10 bytes a clock an SM, 1.9 us of a 6 us call for four 128 x 64 partials
//         (benchmarks/results/gemm-small-h100-round29*.txt).
//         On the mma.sync path split 0 computes the whole k, the others exit.
//   kEpi  the epilogue (below), applied in f32 to the f32 accumulator, then one rounding
//         (round-to-nearest-even) to Out.
//   R     CTAs per SM: 1 (3 warpgroups, producer warpgroup 0 with setmaxnreg) or 2 (BN = 128:
//         288 threads, consumers warpgroups 0-1, producer warp 8, all stages in dynamic memory,
//         so one CTA's pipeline fill and epilogue overlap the other's main loop).
//   TM    tile rows: 128, or 64 (R = 1; one consumer warpgroup): twice the CTAs at small m.
// Persistent variant (gemm_persistent, config t128x128_p): 128 x 128 tiles, a fixed grid (132
// CTAs) walking the tiles, the producer running ahead across tiles, its two consumer warpgroups
// taking turns tile by tile (ping-pong) or sharing each tile (cooperative: kPingPong false, the
// entries whose epilogues are costly, configs.TRANSCENDENTAL_EPILOGUES); see hopper::persistent.
// The epilogue goes through an f32 tile in shared memory (the stages, free after the main loop):
// each thread then owns 8 consecutive columns of a row, one 16-byte store (two for f32).
//
// Epilogues (v = the f32 sum over k, r = row, c = column, f32(x) = exact widening):
//   kNone          v
//   kBias          v + f32(bias[c])
//   kBiasHeads     v + f32(bias[c]), stored in heads layout: r = bi * seq + si, c = hi * hd + di
//                  to C[bi, hi, si, di] (a projection's bias add and transpose to attention heads)
//   kBiasHeadsT    the same, stored at C[bi, hi, di, si] (K^T); both take seq and hd in EpiArgs
//   kBiasGeluErf   x = v + f32(bias[c]);  0.5 * x * (1 + erf(x / sqrt 2))
//   kBiasGeluTanh  x = v + f32(bias[c]);  0.5 * x * (1 + tanh(C * (x + 0.044715 * x^3)))
//                  with C = the kernel's float argument gelu_c (0.7978846 or 0.797724 ...)
//   kBiasRelu      x = v + f32(bias[c]);  x < 0 ? 0 : x   (NaN stays NaN)
//   kBiasSilu      x = v + f32(bias[c]);  x / (1 + exp(-x))
//   kResidual      v + f32(res[b, r, c])
//   kBiasResidual  (v + f32(bias[c])) + f32(res[b, r, c])
//   kScale         alpha * v   (alpha: the kernel's float argument)
//   kGeluErf       0.5 * v * (1 + erf(v / sqrt 2))                 (no bias: exports that fold a zero bias)
//   kGeluTanh      0.5 * v * (1 + tanh(C * (v + 0.044715 * v^3)))
//   kSiluMul       v / (1 + exp(-v)) * f32(up[b, r, c])            (SwiGLU: silu(x Wg) * (x Wu), up in `res`)
// erf is CUDA's erff (no fast math); tanh-GELU and SiLU are sigmoid forms x / (1 + exp(-u)) with
// CUDA's expf and __fdividef (gelu_tanh, div_one_plus_exp below: within 2e-7 of the exact value
// where it is at least 1e-30, measured over 2.2M inputs in benchmarks/results/gemm-epilogue-h100-round38.txt).
//
// Two code paths in one kernel, like matmul.cu: wgmma + TMA (sm_90a, when k % 8 == 0, NN also
// n % 8 == 0, and A, B 16-byte aligned) and mma.sync (sm_80.., and every other shape).
#pragma once

#include "../common/kit_mma.cuh"
#include "../common/kit_sm90.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KIT_SPLIT_K(S) __cluster_dims__(1, 1, S)
#else
#define KIT_SPLIT_K(S)
#endif

namespace kitgemm {

using kit::half_bits;

constexpr int kThreads = 384;
constexpr int BM = 128;
// kitdispatch.toml's dynamic_shared_memory, per architecture (its table: { default = 100352,
// sm_90a = 183296 }). sm_90a objects take 183296 bytes: with the largest static stage (48 KB,
// 128 x 256 tiles) the 227 KiB a Hopper block may have. The others take 100352 (sm_86 and sm_89
// give a block 99 KiB). The stage counts follow it: on sm_90a 128 x 256 tiles get 4 stages (3 at
// 100352), 128 x 128 6 (4), the persistent kernel 5 (3), 128 x 64 7 (5). Every entry checks at
// launch that it got at least this much (require_dynamic_smem). Also a build macro for
// investigations (benchmarks/investigations/gemm_mid.py).
#ifndef KITGEMM_DYNAMIC_SMEM
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KITGEMM_DYNAMIC_SMEM 183296
#else
#define KITGEMM_DYNAMIC_SMEM 100352
#endif
#endif
constexpr int kDynamicSmem = KITGEMM_DYNAMIC_SMEM;

// A launch with less dynamic shared memory than the stages are laid out for (a manifest or a
// direct launch that disagrees with kDynamicSmem for this architecture) would read and write
// past its end: it traps instead, an error at the call rather than a wrong result.
__device__ __forceinline__ void require_dynamic_smem() {
  unsigned size;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(size));
  if (size < kDynamicSmem) __trap();
}
// 1: every persistent entry with cooperative consumers, whatever it names (a build macro for
// benchmarks/investigations/gemm_mid.py's comparison).
#ifndef KITGEMM_PERSISTENT_COOPERATIVE
#define KITGEMM_PERSISTENT_COOPERATIVE 0
#endif
// 1: every persistent entry with ping-pong consumers (benchmarks/investigations/gemm_epilogue.py).
#ifndef KITGEMM_PERSISTENT_PINGPONG
#define KITGEMM_PERSISTENT_PINGPONG 0
#endif
// The ring's depth at most (the barrier words: 2 x 7 mbarriers and two words below 128 bytes).
constexpr int kMaxStages = 7;

// Investigation hooks (benchmarks/investigations/gemm_floor.py): with -DKITGEMM_TRACE each CTA
// writes clock64 at points of its life into kitgemm_trace[block][i] (i = 10, 11: globaltimer at
// entry and exit). Empty otherwise.
#ifdef KITGEMM_TRACE
__device__ unsigned long long kitgemm_trace[4096][12];
__device__ __forceinline__ void kitgemm_mark(int i, bool wall = false) {
  const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned long long t;
  if (wall) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } else {
    t = clock64();
  }
  if (b < 4096) kitgemm_trace[b][i] = t;
}
#define KITGEMM_MARK(...) kitgemm_mark(__VA_ARGS__)
#else
#define KITGEMM_MARK(...)
#endif

enum Epi { kNone, kBias, kBiasGeluErf, kBiasGeluTanh, kBiasRelu, kBiasSilu, kResidual, kBiasResidual, kScale, kGeluErf,
           kGeluTanh, kSiluMul, kBiasHeads, kBiasHeadsT };

template <int kEpi>
struct EpiTraits {
  static constexpr bool kHasBias = kEpi == kBias || kEpi == kBiasGeluErf || kEpi == kBiasGeluTanh ||
                                   kEpi == kBiasRelu || kEpi == kBiasSilu || kEpi == kBiasResidual ||
                                   kEpi == kBiasHeads || kEpi == kBiasHeadsT;
  static constexpr bool kHasRes = kEpi == kResidual || kEpi == kBiasResidual || kEpi == kSiluMul;
  static constexpr bool kHeads = kEpi == kBiasHeads || kEpi == kBiasHeadsT;  // C not row-major: out_offset
};

// x / d for 0 <= x < 2^31 by a multiply-high, an add and a shift, the divisor's magic number
// computed once (Hacker's Delight 10-9, the round-up method of PyTorch's IntDivider): the heads epilogues' row and
// column splits, which a plain division made 10-15% of a 4096x768x768 call.
struct FastDiv {
  unsigned d = 1, magic = 1, shift = 0;
  __device__ void set(unsigned divisor) {
    d = divisor;
    shift = 0;
    while ((1u << shift) < d) ++shift;
    magic = (unsigned)(((1ull << 32) * ((1ull << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ unsigned div(unsigned x) const { return (__umulhi(x, magic) + x) >> shift; }
};

template <class Out>
struct EpiArgs {
  const typename Out::T* bias;  // [n]
  const typename Out::T* res;   // [m, n] of this batch
  float scalar;                 // alpha (kScale) or C (kBiasGeluTanh, kGeluTanh)
  int seq = 1, hd = 1;          // kBiasHeads, kBiasHeadsT: rows per batch and the head dim
  FastDiv by_seq, by_hd;        // set from seq and hd by prepare_heads
};

// The heads epilogues' dividers, once per thread before the epilogue.
template <int kEpi, class Out>
__device__ __forceinline__ void prepare_heads(EpiArgs<Out>& e);

// Where C[r, c] goes: row-major [m, n], or the heads layouts (kBiasHeads: [m / seq, n / hd,
// seq, hd]; kBiasHeadsT: [m / seq, n / hd, hd, seq]).
template <int kEpi, class Out>
__device__ __forceinline__ long long out_offset(const EpiArgs<Out>& e, int n, int r, int c) {
  if constexpr (EpiTraits<kEpi>::kHeads) {
    // ((bi * heads + hi) * seq + si) * hd + di (kBiasHeadsT: si and di swapped), heads * hd = n
    const int bi = e.by_seq.div(r), si = r - bi * e.seq, hi = e.by_hd.div(c), di = c - hi * e.hd;
    const long long head = (long long)bi * n * e.seq + (long long)hi * e.seq * e.hd;
    return head + (kEpi == kBiasHeads ? (long long)si * e.hd + di : (long long)di * e.seq + si);
  } else {
    return (long long)r * n + c;
  }
}

template <int kEpi, class Out>
__device__ __forceinline__ void prepare_heads(EpiArgs<Out>& e) {
  if constexpr (EpiTraits<kEpi>::kHeads) {
    e.by_seq.set(e.seq);
    e.by_hd.set(e.hd);
  }
}

// One element of C (an f32, or rounded once to f16/bf16).
template <class Out>
__device__ __forceinline__ void store1(typename Out::T* p, float x) {
  if constexpr (sizeof(typename Out::T) == 4) {
    *p = x;
  } else {
    *p = half_bits(kit::pack2<Out>(x, 0.f) & 0xffff);
  }
}

template <class Out>
__device__ __forceinline__ float load_out(const typename Out::T* p) {
  if constexpr (sizeof(typename Out::T) == 4) {
    return *p;
  } else {
    return kit::to_float<Out>(*p);
  }
}

// x / (1 + e^-u) with __fdividef (2 ulp for denominators up to 2^126, 0 beyond: the limit): IEEE
// division's slow path ends a basic block per element, and with it bias_silu took 480.3 us at
// 2048x11008x4096 in the persistent kernel against 332.6 now and 318.7 for bias (H100, round 38,
// benchmarks/results/gemm-epilogue-h100-round38.txt, run E).
__device__ __forceinline__ float div_one_plus_exp(float x, float u) { return __fdividef(x, 1.0f + expf(-u)); }
// x (1 + tanh u) / 2 = x / (1 + e^-2u), u = c (x + 0.044715 x^3): no cancellation where tanh u
// nears -1 (1 + tanhf(u) lost up to all of it below x = -5), and 2-9% faster than tanhf.
__device__ __forceinline__ float gelu_tanh(float x, float c) {
  return div_one_plus_exp(x, 2.0f * c * fmaf(0.044715f * x, x * x, x));
}

// The epilogue of one element from its bias and residual values (unused ones ignored).
template <int kEpi>
__device__ __forceinline__ float epilogue_of(float v, float bias, float res, float scalar) {
  if constexpr (kEpi == kScale) {
    return scalar * v;
  } else if constexpr (kEpi == kSiluMul) {
    return div_one_plus_exp(v, v) * res;
  } else {
    if constexpr (EpiTraits<kEpi>::kHasBias) v = v + bias;
    if constexpr (kEpi == kBiasGeluErf || kEpi == kGeluErf) v = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    if constexpr (kEpi == kBiasGeluTanh || kEpi == kGeluTanh) v = gelu_tanh(v, scalar);
    if constexpr (kEpi == kBiasRelu) v = v < 0.0f ? 0.0f : v;
    if constexpr (kEpi == kBiasSilu) v = div_one_plus_exp(v, v);
    if constexpr (EpiTraits<kEpi>::kHasRes) v = v + res;
    return v;
  }
}

template <int kEpi, class Out>
__device__ __forceinline__ float epilogue(float v, const EpiArgs<Out>& e, long long row_off, int c) {
  float bias = 0.f, res = 0.f;
  if constexpr (EpiTraits<kEpi>::kHasBias) bias = load_out<Out>(e.bias + c);
  if constexpr (EpiTraits<kEpi>::kHasRes) res = load_out<Out>(e.res + row_off + c);
  return epilogue_of<kEpi>(v, bias, res, e.scalar);
}

// 8 consecutive elements at p (16-byte aligned), as they are: one or two 16-byte loads.
template <class Out>
__device__ __forceinline__ void load_words8(const typename Out::T* p, uint4 (&words)[sizeof(typename Out::T) / 2]) {
#pragma unroll
  for (int w = 0; w < int(sizeof(typename Out::T) / 2); ++w) words[w] = reinterpret_cast<const uint4*>(p)[w];
}

// 8 elements of type Out in 16-byte words -> floats.
template <class Out>
__device__ __forceinline__ void unpack8(const uint4* words, float (&v)[8]) {
  if constexpr (sizeof(typename Out::T) == 4) {
    const float* f = reinterpret_cast<const float*>(words);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = f[i];
  } else {
    const unsigned u[4] = {words[0].x, words[0].y, words[0].z, words[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = kit::to_float<Out>(half_bits(u[i] & 0xffff));
      v[2 * i + 1] = kit::to_float<Out>(half_bits(u[i] >> 16));
    }
  }
}

// The bias and residual of one store8 (8 columns from c of row r) in their 16-byte words, loaded
// ahead of the epilogue's stores: the compiler may not move a load above an earlier store to C
// (they may alias), so store8's own loads left each iteration waiting its full global latency
// (bias_residual at 2048x3072x768 in the persistent kernel: 39.4 us against 25.9 with the loads
// ahead, H100, round 38, run E). `valid` where store8 takes its 16-byte path with aligned bias and residual.
template <int kEpi, class Out>
struct Ahead {
  static constexpr int kWords = sizeof(typename Out::T) / 2;  // 16-byte words of 8 elements
  uint4 bias[EpiTraits<kEpi>::kHasBias ? kWords : 1], res[EpiTraits<kEpi>::kHasRes ? kWords : 1];
  bool valid = false;
};

template <int kEpi, class Out>
__device__ __forceinline__ bool ahead_applies(const EpiArgs<Out>& e, int m, int n, int r, int c, bool vec) {
  if (kEpi == kBiasHeads && e.hd % 8 != 0) vec = false;
  return r < m && vec && c + 8 <= n && (!EpiTraits<kEpi>::kHasBias || kit::aligned16(e.bias)) &&
         (!EpiTraits<kEpi>::kHasRes || kit::aligned16(e.res));
}

template <int kEpi, class Out>
__device__ __forceinline__ void load_ahead(const EpiArgs<Out>& e, int m, int n, int r, int c, bool vec,
                                           Ahead<kEpi, Out>& a, bool with_bias = true) {
  a.valid = ahead_applies<kEpi, Out>(e, m, n, r, c, vec);
  if (!a.valid) return;
  if constexpr (EpiTraits<kEpi>::kHasBias) {
    if (with_bias) load_words8<Out>(e.bias + c, a.bias);
  }
  if constexpr (EpiTraits<kEpi>::kHasRes) load_words8<Out>(e.res + (long long)r * n + c, a.res);
}

// 8 consecutive elements at p (16-byte aligned) as floats: one or two 16-byte loads.
template <class Out>
__device__ __forceinline__ void load8(const typename Out::T* p, float (&v)[8]) {
  if constexpr (sizeof(typename Out::T) == 4) {  // as float4s (the words' path compiles differently)
    const float4 x = reinterpret_cast<const float4*>(p)[0], y = reinterpret_cast<const float4*>(p)[1];
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w, v[4] = y.x, v[5] = y.y, v[6] = y.z, v[7] = y.w;
  } else {
    uint4 words[1];
    load_words8<Out>(p, words);
    unpack8<Out>(words, v);
  }
}

template <class Out>
__device__ __forceinline__ bool pairs_aligned(const typename Out::T* c, int n) {
  return n % 2 == 0 && (reinterpret_cast<unsigned long long>(c) % (2 * sizeof(typename Out::T))) == 0;
}

// C[r, c] and C[r, c + 1] (when c + 1 < n) from the accumulators x, y.
template <int kEpi, class Out>
__device__ __forceinline__ void store2(typename Out::T* C, const EpiArgs<Out>& e, int m, int n, int r, int c, float x,
                                       float y, bool paired) {
  if (r >= m || c >= n) return;
  const long long off = (long long)r * n;
  const bool two = c + 1 < n;
  x = epilogue<kEpi, Out>(x, e, off, c);
  if (two) y = epilogue<kEpi, Out>(y, e, off, c + 1);
  if constexpr (EpiTraits<kEpi>::kHeads) {
    // c is even: c, c + 1 are one head's neighbours in kBiasHeads where hd is even
    if (kEpi == kBiasHeads && e.hd % 2 == 0) {
      kit::store_pair<Out>(C + out_offset<kEpi, Out>(e, n, r, c), x, y, two, paired);
    } else {
      store1<Out>(C + out_offset<kEpi, Out>(e, n, r, c), x);
      if (two) store1<Out>(C + out_offset<kEpi, Out>(e, n, r, c + 1), y);
    }
  } else {
    kit::store_pair<Out>(C + off + c, x, y, two, paired);
  }
}

// The bias and residual of C[r, c .. c + 7] (c a multiple of 8, rows 16-byte aligned): 16-byte
// loads where aligned, else element by element.
template <int kEpi, class Out>
__device__ __forceinline__ void load_operands8(const EpiArgs<Out>& e, long long off, int c, float (&bias)[8],
                                               float (&res)[8]) {
  if constexpr (EpiTraits<kEpi>::kHasBias) {
    if (kit::aligned16(e.bias)) {
      load8<Out>(e.bias + c, bias);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) bias[i] = load_out<Out>(e.bias + c + i);
    }
  }
  if constexpr (EpiTraits<kEpi>::kHasRes) {
    if (kit::aligned16(e.res)) {
      load8<Out>(e.res + off + c, res);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) res[i] = load_out<Out>(e.res + off + c + i);
    }
  }
}

// C[r, c .. c + 7] (the columns < n) from the f32 sums v: epilogue, rounding, one 16-byte store
// (two for f32) where `vec` (rows 16-byte aligned) and all 8 are in range. Bias and residual
// from `ahead` where it holds them (load_ahead), else loaded here.
template <int kEpi, class Out>
__device__ __forceinline__ void store8(typename Out::T* C, const EpiArgs<Out>& e, int m, int n, int r, int c,
                                       float (&v)[8], bool vec, const Ahead<kEpi, Out>* ahead = nullptr) {
  if (r >= m || c >= n) return;
  const long long off = (long long)r * n;
  typename Out::T* p = C + out_offset<kEpi, Out>(e, n, r, c);
  // kBiasHeads: 8 columns from a multiple of 8 are one head's, contiguous, where hd % 8 == 0
  if (kEpi == kBiasHeads && e.hd % 8 != 0) vec = false;
  if (vec && c + 8 <= n) {
    // bias and residual as 16-byte loads too (c is a multiple of 8; `vec` makes rows aligned)
    float bias[8] = {}, res[8] = {};
    if (ahead != nullptr && ahead->valid) {
      if constexpr (EpiTraits<kEpi>::kHasBias) unpack8<Out>(ahead->bias, bias);
      if constexpr (EpiTraits<kEpi>::kHasRes) unpack8<Out>(ahead->res, res);
    } else if constexpr (EpiTraits<kEpi>::kHasBias || EpiTraits<kEpi>::kHasRes) {
      load_operands8<kEpi, Out>(e, off, c, bias, res);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = epilogue_of<kEpi>(v[i], bias[i], res[i], e.scalar);
    if constexpr (kEpi == kBiasHeadsT) {  // the 8 columns are 8 rows of K^T: element by element
#pragma unroll
      for (int i = 0; i < 8; ++i) store1<Out>(C + out_offset<kEpi, Out>(e, n, r, c + i), v[i]);
    } else if constexpr (sizeof(typename Out::T) == 4) {
      reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      uint4 w;
      w.x = kit::pack2<Out>(v[0], v[1]), w.y = kit::pack2<Out>(v[2], v[3]);
      w.z = kit::pack2<Out>(v[4], v[5]), w.w = kit::pack2<Out>(v[6], v[7]);
      *reinterpret_cast<uint4*>(p) = w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (c + i < n) {
        const float x = epilogue<kEpi, Out>(v[i], e, off, c + i);
        store1<Out>(EpiTraits<kEpi>::kHeads ? C + out_offset<kEpi, Out>(e, n, r, c + i) : p + i, x);
      }
    }
  }
}

// Block (x, y) -> tile (row, column) of C, in bands of kBand tile rows walked column by column,
// so the blocks in flight share their A rows and B columns in L2.
constexpr int kBand = 8;
__device__ __forceinline__ void block_tile(int& tile_m, int& tile_n) {
  const int tiles_n = gridDim.x, tiles_m = gridDim.y;
  const int id = blockIdx.y * tiles_n + blockIdx.x;
  const int band = id / (kBand * tiles_n), first = band * kBand;
  const int rows = min(tiles_m - first, kBand);
  const int in_band = id % (kBand * tiles_n);
  tile_m = first + in_band % rows;
  tile_n = in_band / rows;
}

// ============================================================ mma.sync path (sm_80 and up)

namespace ampere {

constexpr int SUB = 64, BK = 32, kStages = 3, kGroupThreads = 128;
constexpr int kGroups = kThreads / kGroupThreads;
constexpr int A_STRIDE = BK + 8, B_STRIDE = SUB + 8;
constexpr int kStageHalves = SUB * A_STRIDE + SUB * A_STRIDE;  // room for B either way (NT: SUB x BK rows)
constexpr int kGroupBytes = kStages * kStageHalves * 2;
static_assert(kGroups * kGroupBytes <= kDynamicSmem, "the groups' stages fit the dynamic shared memory");
static_assert(BK * B_STRIDE <= SUB * A_STRIDE, "NN's B stage fits");

struct Sub {
  const half_bits* A;
  const half_bits* B;
  int m, n, k;
  bool vec;
};

// rows [r0, r0 + 64) x cols [c0, c0 + 32) of a row-major [rows, cols] matrix -> dst (A_STRIDE).
__device__ __forceinline__ void load_rows(half_bits* dst0, const half_bits* src, int rows, int cols, int r0, int c0,
                                          bool vec, int gtid) {
  for (int i = gtid; i < SUB * BK / 8; i += kGroupThreads) {
    const int r = i / (BK / 8), c = i % (BK / 8) * 8;
    half_bits* dst = dst0 + r * A_STRIDE + c;
    const int row = r0 + r, col = c0 + c;
    if (vec) {
      const bool ok = row < rows && col < cols;
      kit::cp_async16(dst, ok ? src + (long long)row * cols + col : src, ok);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[e] = row < rows && col + e < cols ? src[(long long)row * cols + col + e] : 0;
    }
  }
}

template <bool kNT>
__device__ __forceinline__ void load_stage(const Sub& p, half_bits* As, half_bits* Bs, int sm, int sn, int k0, int gtid) {
  load_rows(As, p.A, p.m, p.k, sm, k0, p.vec, gtid);
  if constexpr (kNT) {
    load_rows(Bs, p.B, p.n, p.k, sn, k0, p.vec, gtid);
  } else {
    for (int i = gtid; i < BK * SUB / 8; i += kGroupThreads) {
      const int r = i / (SUB / 8), c = i % (SUB / 8) * 8;
      half_bits* dst = Bs + r * B_STRIDE + c;
      const int row = k0 + r, col = sn + c;
      if (p.vec) {
        const bool ok = row < p.k && col < p.n;
        kit::cp_async16(dst, ok ? p.B + (long long)row * p.n + col : p.B, ok);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) dst[e] = row < p.k && col + e < p.n ? p.B[(long long)row * p.n + col + e] : 0;
      }
    }
  }
}

template <class E, bool kNT>
__device__ __forceinline__ void mma_stage(float (&acc)[2][4][4], const half_bits* As, const half_bits* Bs, int wm,
                                          int wn, int lane) {
#pragma unroll
  for (int kk = 0; kk < BK; kk += 16) {
    unsigned a[2][4], b[4][2];
#pragma unroll
    for (int i = 0; i < 2; ++i) kit::ldmatrix_x4(a[i], As + (wm + i * 16 + lane % 16) * A_STRIDE + kk + lane / 16 * 8);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      unsigned r[4];
      if constexpr (kNT) {  // B stage is [n][k]: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, ...)
        const int mi = lane / 8;
        kit::ldmatrix_x4(r, Bs + (wn + j * 16 + mi / 2 * 8 + lane % 8) * A_STRIDE + kk + mi % 2 * 8);
      } else {
        kit::ldmatrix_x4_trans(r, Bs + (kk + lane % 16) * B_STRIDE + wn + j * 16 + lane / 16 * 8);
      }
      b[2 * j][0] = r[0], b[2 * j][1] = r[1], b[2 * j + 1][0] = r[2], b[2 * j + 1][1] = r[3];
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) kit::mma_16x8x16<E>(acc[i][j], a[i], b[j][0], b[j][1]);
  }
}

template <class E, class Out, bool kNT, int kEpi>
__device__ void sub_tile(const Sub& p, typename Out::T* C, const EpiArgs<Out>& e, int sm, int sn, half_bits* smem,
                         int bar) {
  const int gtid = threadIdx.x % kGroupThreads, warp = gtid / 32, lane = gtid % 32;
  const int wm = warp / 2 * 32, wn = warp % 2 * 32;
  auto stage_a = [&](int s) { return smem + s * kStageHalves; };
  auto stage_b = [&](int s) { return smem + s * kStageHalves + SUB * A_STRIDE; };
  float acc[2][4][4] = {};
  const int ktiles = (p.k + BK - 1) / BK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load_stage<kNT>(p, stage_a(s), stage_b(s), sm, sn, s * BK, gtid);
    kit::cp_async_commit();
  }
  for (int t = 0; t < ktiles; ++t) {
    kit::cp_async_wait<kStages - 2>();
    kit::named_barrier(bar, kGroupThreads);
    const int next = t + kStages - 1;
    if (next < ktiles) load_stage<kNT>(p, stage_a(next % kStages), stage_b(next % kStages), sm, sn, next * BK, gtid);
    kit::cp_async_commit();
    mma_stage<E, kNT>(acc, stage_a(t % kStages), stage_b(t % kStages), wm, wn, lane);
  }
  kit::cp_async_wait<0>();
  kit::named_barrier(bar, kGroupThreads);

  const bool paired = pairs_aligned<Out>(C, p.n);
  const int g = lane / 4, c2 = lane % 4 * 2;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = sm + wm + i * 16 + g, c = sn + wn + j * 8 + c2;
      store2<kEpi, Out>(C, e, p.m, p.n, r, c, acc[i][j][0], acc[i][j][1], paired);
      store2<kEpi, Out>(C, e, p.m, p.n, r + 8, c, acc[i][j][2], acc[i][j][3], paired);
    }
}

template <class E, class Out, bool kNT, int BN, int kEpi, int NG = kGroups, int TM = BM>
__device__ void block(const half_bits* A, const half_bits* B, typename Out::T* C, const EpiArgs<Out>& e, int m, int n,
                      int k, int bm, int bn, char* smem) {
  const int group = threadIdx.x / kGroupThreads;
  if (group >= NG) return;
  const bool vec = k % 8 == 0 && (kNT || n % 8 == 0) && kit::aligned16(A) && kit::aligned16(B);
  const Sub p{A, B, m, n, k, vec};
  half_bits* mine = reinterpret_cast<half_bits*>(smem + group * kGroupBytes);
  // SUB x SUB sub-tiles covering the tile; where BN is not a multiple of SUB (an investigation's
  // BN 96) the last reaches into the next tile's columns and writes the same values there
  constexpr int kCols = (BN + SUB - 1) / SUB;
  for (int s = group; s < (TM / SUB) * kCols; s += NG) {
    const int sm = bm + s / kCols * SUB, sn = bn + s % kCols * SUB;
    if (sm < m && sn < n) sub_tile<E, Out, kNT, kEpi>(p, C, e, sm, sn, mine, 1 + group);
  }
}

}  // namespace ampere

// ============================================================ wgmma + TMA path (sm_90a)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace hopper {

using namespace kit::sm90;

// TM: tile rows, 128 (two consumer warpgroups of 64 rows) or 64 (one consumer warpgroup; the
// other waits: more CTAs at small m without a split, as cuBLAS's 64-row tiles at M = 128).
// R: CTAs per SM. R = 1: stage 0 is a static array of kStageBytes, stages 1.. in the dynamic
// memory (after up to 1 KB of alignment padding), then the barriers and the two maps; static +
// dynamic memory exceed half an SM, so one CTA per SM and the SM's tensor-map slot is its own.
// R = 2: every stage in the dynamic memory (no static stage), at most two CTAs per SM, each
// takes one of the SM's two slots under a lock word (acquired before the maps are written,
// released once every copy has landed).
// kSub: boxes of k 64 per operand a stage (a stage holds k 64 x kSub). Each stage costs its
// consumer a barrier round (wait, wgmmas, commit, wait for the one before, free it): at k 64 a
// 64-row tile spent about 165 ns a stage at any slice size; with k 128 its main loop at
// 128x768x768 took 1.34 us against 1.98 (H100, round 37; stage_boxes).
template <int BN, int R = 1, int TM = BM, int kSubBoxes = 1>
struct Cfg {
  static constexpr int BK = 64;  // k of one box (128 bytes: the 128-byte swizzle's row)
  static constexpr int kSub = kSubBoxes, KS = BK * kSub;  // boxes per operand, k of a stage
  static constexpr int kABox = TM * BK * 2, kBBox = BN * BK * 2;  // bytes of one box: box h at a(s) + h * kABox
  static constexpr int kABytes = kABox * kSub, kBBytes = kBBox * kSub, kStageBytes = kABytes + kBBytes;
#ifdef KITGEMM_NO_STATIC_STAGE  // investigations: every stage in the dynamic memory (with a larger KITGEMM_DYNAMIC_SMEM)
  static constexpr int kStatic = 0;
#else
  static constexpr int kStatic = R == 1 ? 1 : 0;
#endif
  static constexpr int kFit = kStatic + (kDynamicSmem - 1023 - 128 - 2 * kTensorMapBytes) / kStageBytes;
  static constexpr int kStages = kFit < kMaxStages ? kFit : kMaxStages;
  static constexpr int kBarrierOffset = (kStages - kStatic) * kStageBytes;
  static constexpr int kMapOffset = kBarrierOffset + 128;
  static constexpr int kStaticBytes = kStatic == 1 ? kStageBytes : 16;
  static_assert(kStages >= 3, "pipeline depth");
  static_assert(kStatic * kStageBytes + kDynamicSmem <= 227 * 1024, "a block's shared memory");
  static_assert(1023 + kMapOffset + 2 * kTensorMapBytes <= kDynamicSmem, "dynamic shared memory layout");
  static_assert(R == 2 || kDynamicSmem + kStageBytes > 227 * 1024 / 2, "one block per SM (the tensor-map slots rely on it)");
  static_assert(R == 1 || (R == 2 && kDynamicSmem > 228 * 1024 / 3), "at most two blocks per SM (two slots per SM)");
};

__device__ __align__(128) unsigned char tensor_map_slots[kTensorMapSlots][2][kTensorMapBytes];
__device__ __align__(128) unsigned char tensor_map_slots2[kTensorMapSlots][2][2][kTensorMapBytes];
__device__ unsigned tensor_map_locks[kTensorMapSlots][2];

// Boxes per operand a stage: 2 for the 64-row tiles without a split (t64x64: 4.77 against 5.28 us
// at 128x768x768, 5.10 against 5.38 at 512x768x768; k 192 measured within 2% of it), 1 elsewhere
// (t64x64_k4 7.39 against 7.18 us at 128x768x3072; 128-row tiles' stages would not fit the static
// stage). benchmarks/results/gemm-small-h100-round37.txt.
template <int TM, int S, int BN>
__host__ __device__ constexpr int stage_boxes() {
#ifdef KITGEMM_STAGE_BOXES  // investigations: every config
  return KITGEMM_STAGE_BOXES;
#else
  return TM == 64 && S == 1 && BN == 64 ? 2 : 1;
#endif
}

struct Smem {
  unsigned stage0, dyn;
  int stage_bytes, a_bytes, dyn_first;
  unsigned long long* full;
  unsigned long long* empty;
  __device__ unsigned a(int s) const { return s < dyn_first ? stage0 : dyn + (s - dyn_first) * stage_bytes; }
  __device__ unsigned b(int s) const { return a(s) + a_bytes; }
};

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// The cluster barrier without the release fence, for the last sync of a split-K epilogue ("every
// CTA has read my partials"): it orders only remote loads whose values this thread has already
// used, and the release form waits for every global store of the epilogue to complete first
// (MEMBAR.ALL.GPU in the SASS): 0.3-3 us per split-K call on an H100
// (benchmarks/results/gemm-floor-h100.txt).
__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed;\nbarrier.cluster.wait;\n" ::: "memory");
}
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ float4 ld_cluster_v4(unsigned local_addr, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local_addr), "r"(rank));
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}
__device__ __forceinline__ unsigned ld_cluster_u32(unsigned local_addr, unsigned rank) {
  unsigned remote, v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local_addr), "r"(rank));
  asm volatile("ld.shared::cluster.u32 %0, [%1];\n" : "=r"(v) : "r"(remote) : "memory");
  return v;
}

// Split-K partials of S >= 4 on their way to the CTA that owns their rows (S = 2 pulls the one
// other partial through distributed shared memory: as fast or faster there, measured on an H100 in
// benchmarks/results/gemm-small-h100-round29*.txt, e.g. 15.3 against 16.3 us at 128x4096x4096;
// at S = 4 the slots are 5-11% faster): slot i belongs to the CTA on SM
// i (one split-K CTA per SM: its shared memory leaves room for no other R = 1 CTA), which writes
// the rows of its staging tile that other CTAs own, compacted ([128 - 128 / S rows][CW]), and
// keeps the slot until the cluster's last barrier, after every owner has read it. 8 MB for 256
// SM ids; a variable template, so only the split-K entries' objects carry it.
constexpr int kSplitSlotFloats = 8192;  // (128 - 128 / S) x CW floats at most (S = 2, CW = 128)
template <int kUnused = 0>
__device__ __align__(16) float splitk_slots[kTensorMapSlots][kSplitSlotFloats];

template <int S>
__host__ __device__ constexpr bool uses_slots() {
  return S >= 4;
}

// The epilogue's pass width (columns of the staging tile a pass): 128 at most, and for a split
// through the slots narrow enough that the other CTAs' rows fit a slot.
template <int BN, int S, int TM>
__host__ __device__ constexpr int epilogue_cols() {
  constexpr int cw = BN < 128 ? BN : BN % 128 == 0 ? 128 : BN / 2;  // 192: two passes of 96
  return uses_slots<S>() && (TM - TM / S) * cw > kSplitSlotFloats ? 64 : cw;
}

// Warp 0 of the producer warpgroup: builds and publishes the maps, then lane 0 keeps the ring
// full with k slices kt0 .. kt0 + nt - 1.
template <class E, bool kNT, int BN, int R, int TM, int kSub>
__device__ void produce(const Smem& sm, const half_bits* A, const half_bits* B, int batch, int m, int n, int k, int bz,
                        int bm, int bn, int kt0, int nt, unsigned maps, void* slot) {
  using C = Cfg<BN, R, TM, kSub>;
  const int lane = threadIdx.x % 32;
  void* map_a = slot;
  void* map_b = static_cast<char*>(slot) + kTensorMapBytes;
  if (lane == 0) {
    KITGEMM_MARK(1);
    tensor_map_3d<E>(maps, A, k, m, batch, C::BK, TM);
    if constexpr (kNT) {
      tensor_map_3d<E>(maps + kTensorMapBytes, B, k, n, batch, C::BK, BN);
    } else {
      tensor_map_3d<E>(maps + kTensorMapBytes, B, n, k, batch, 64, C::BK);
    }
    KITGEMM_MARK(2);
  }
  __syncwarp();
  tensor_map_publish(map_a, maps);
  tensor_map_publish(map_b, maps + kTensorMapBytes);
  if (lane == 0) {
    KITGEMM_MARK(3);
    tensor_map_acquire(map_a);
    tensor_map_acquire(map_b);
    KITGEMM_MARK(4);
    for (int t = 0; t < nt; ++t) {
      const int s = t % C::kStages;
      mbar_wait(&sm.empty[s], ((t / C::kStages) & 1) ^ 1);
      mbar_arrive_expect_tx(&sm.full[s], C::kStageBytes);
#pragma unroll
      for (int h = 0; h < C::kSub; ++h) {
        const int k0 = (kt0 + t) * C::KS + h * C::BK;
        const unsigned a = sm.a(s) + h * C::kABox, b = sm.b(s) + h * C::kBBox;
        tma_load_3d(a, map_a, k0, bm, bz, &sm.full[s]);
        if constexpr (kNT) {
          tma_load_3d(b, map_b, k0, bn, bz, &sm.full[s]);
        } else {
#pragma unroll
          for (int j = 0; j < BN / 64; ++j) tma_load_3d(b + j * 64 * C::BK * 2, map_b, bn + j * 64, k0, bz, &sm.full[s]);
        }
      }
    }
  }
  __syncwarp();
}

// One k slice (64) of a 64-row band of the tile into d: four wgmmas of k16, A rows at `a` (K-major),
// B at `b`: NT [BN rows of n][64 k], K-major like A; NN BN / 64 boxes of [64 k rows][64 n], N-major.
// With a second accumulator `d2` (kChains 2) the odd k16 steps go there: two dependency chains
// that the tensor cores run side by side.
template <class E, bool kNT, int BN, int kChains = 1>
__device__ __forceinline__ void slice_mma(float (&d)[BN / 2], float (&d2)[BN / 2], unsigned a, unsigned b) {
  constexpr int BK = 64;
#pragma unroll
  for (int kk = 0; kk < BK / 16; ++kk) {
    float(&acc)[BN / 2] = kChains == 2 && kk % 2 == 1 ? d2 : d;
    if constexpr (kNT) {
      wgmma_ss<E, BN, 0>(acc, smem_desc_sw128(a + kk * 32, 16, 1024), smem_desc_sw128(b + kk * 32, 16, 1024));
    } else {
      wgmma_ss<E, BN, 1>(acc, smem_desc_sw128(a + kk * 32, 16, 1024), smem_desc_sw128(b + kk * 16 * 128, 64 * BK * 2, 1024));
    }
  }
}
template <class E, bool kNT, int BN>
__device__ __forceinline__ void slice_mma(float (&d)[BN / 2], unsigned a, unsigned b) {
  slice_mma<E, kNT, BN, 1>(d, d, a, b);
}

// Accumulator chains of block()'s consumers: two where one consumer warpgroup takes the tile
// (TM = 64; with two warpgroups their chains already run side by side). On an H100 (round 37,
// benchmarks/results/gemm-small-h100-round37.txt) the main loop of t64x64 at 128x768x768 took
// 2.0 us against 2.36 with one chain, 3-4% of the call; a 128 x 64 tile gained nothing.
// KITGEMM_CHAINS_TM: a build macro for investigations (0: one chain everywhere).
#ifndef KITGEMM_CHAINS_TM
#define KITGEMM_CHAINS_TM 64
#endif
template <int TM>
__host__ __device__ constexpr int accumulator_chains() {
  return TM <= KITGEMM_CHAINS_TM ? 2 : 1;
}

// A consumer warpgroup's pass over the ring's slices g0 .. g0 + nt - 1 (slice g in stage
// g % kStages): per slice, wait until its stage is full, `mma(stage, t)` (the wgmmas of slice
// g0 + t), and once they are issued free the stage before it, whose wgmmas are then done. At the
// end every wgmma is done; `release_last` frees the last stage too (a producer that loads on).
template <int kStages, class Mma>
__device__ __forceinline__ void consume_slices(const Smem& sm, int g0, int nt, bool release_last, Mma&& mma) {
  const bool leader = threadIdx.x % 128 == 0;
  for (int t = 0; t < nt; ++t) {
    const int g = g0 + t, s = g % kStages;
    mbar_wait(&sm.full[s], (g / kStages) & 1);
    wgmma_fence();
    mma(s, t);
    wgmma_commit();
    wgmma_wait<1>();
    if (t > 0 && leader) mbar_arrive(&sm.empty[(g - 1) % kStages]);
  }
  wgmma_wait<0>();
  if (release_last && nt > 0 && leader) mbar_arrive(&sm.empty[(g0 + nt - 1) % kStages]);
}

// Consumer warpgroup `wg` (0 or 1): rows 64 * wg .. + 64 of the tile, k slices 0 .. nt - 1 of
// this CTA's share.
template <class E, bool kNT, int BN, int R, int TM, int kSub>
__device__ __forceinline__ void mainloop(float (&d)[BN / 2], const Smem& sm, int nt, int wg) {
  using C = Cfg<BN, R, TM, kSub>;
  constexpr int kChains = accumulator_chains<TM>();
  float d2[kChains == 2 ? BN / 2 : 1];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) d[i] = 0.f;
  if constexpr (kChains == 2) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) d2[i] = 0.f;
  }
  consume_slices<C::kStages>(sm, 0, nt, false, [&](int s, int t) {
    if (t == 0 && threadIdx.x == 128) KITGEMM_MARK(5);
#pragma unroll
    for (int h = 0; h < C::kSub; ++h) {
      const unsigned a = sm.a(s) + h * C::kABox + wg * 64 * C::BK * 2, b = sm.b(s) + h * C::kBBox;
      if constexpr (kChains == 2) {
        slice_mma<E, kNT, BN, 2>(d, d2, a, b);
      } else {
        slice_mma<E, kNT, BN>(d, a, b);
      }
    }
  });
  if constexpr (kChains == 2) {  // the two partial sums over k, added once
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) d[i] += d2[i];
  }
}

// Accumulator columns [CH * CW, CH * CW + CW) of this thread -> the f32 staging tile.
template <int CH, int CW, int LD, int N>
__device__ __forceinline__ void stage_columns(float* tile, const float (&d)[N], int lr, int lane) {
#pragma unroll
  for (int j = CH * CW / 8; j < (CH + 1) * CW / 8; ++j) {
    const int lc = j * 8 - CH * CW + 2 * (lane % 4);
    *reinterpret_cast<float2*>(&tile[lr * LD + lc]) = make_float2(d[4 * j], d[4 * j + 1]);
    *reinterpret_cast<float2*>(&tile[(lr + 8) * LD + lc]) = make_float2(d[4 * j + 2], d[4 * j + 3]);
  }
}

// Pass `ch` (< P + 1) of stage_columns, for a pass index known only at run time.
template <int P, int CW, int LD, int N>
__device__ __forceinline__ void stage_pass(int ch, float* tile, const float (&d)[N], int lr, int lane) {
  if constexpr (P > 0) {
    if (ch == P) {
      stage_columns<P, CW, LD>(tile, d, lr, lane);
      return;
    }
    stage_pass<P - 1, CW, LD>(ch, tile, d, lr, lane);
  } else {
    stage_columns<0, CW, LD>(tile, d, lr, lane);
  }
}

template <class E, class Out, bool kNT, int BN, int S, int kEpi, int R, int TM>
__device__ void block(const half_bits* A, const half_bits* B, typename Out::T* C, const EpiArgs<Out>& e, int batch,
                      int m, int n, int k, int bz, int split, int bm, int bn, unsigned stage0, char* dyn_smem) {
  constexpr int kSub = stage_boxes<TM, S, BN>();
  using Cf = Cfg<BN, R, TM, kSub>;
  constexpr int kConsumerWgs = TM / 64, kConsumers = 128 * kConsumerWgs;
  const unsigned dyn = (kit::smem_addr(dyn_smem) + 1023) & ~1023u;
  char* dyn_aligned = dyn_smem + (dyn - kit::smem_addr(dyn_smem));
  unsigned* slot_sel = reinterpret_cast<unsigned*>(dyn_aligned + Cf::kBarrierOffset + 120);
  Smem sm{stage0, dyn, Cf::kStageBytes, Cf::kABytes, Cf::kStatic,
          reinterpret_cast<unsigned long long*>(dyn_aligned + Cf::kBarrierOffset),
          reinterpret_cast<unsigned long long*>(dyn_aligned + Cf::kBarrierOffset) + Cf::kStages};
  const int ktiles = (k + Cf::KS - 1) / Cf::KS;
  const int kt0 = ktiles * split / S, nt = ktiles * (split + 1) / S - kt0;
  if (threadIdx.x == 0) {
    KITGEMM_MARK(10, true);
    KITGEMM_MARK(0);
    for (int s = 0; s < Cf::kStages; ++s) {
      mbar_init(&sm.full[s], 1);
      mbar_init(&sm.empty[s], kConsumerWgs);
    }
    mbar_init_fence();
  }
  __syncthreads();
  // R = 1: warpgroup 0 produces (setmaxnreg moves its registers to the consumers), warpgroups
  // 1 and 2 consume (TM = 64: warpgroup 1; warpgroup 2 only joins the cluster barriers). R = 2
  // (288 threads, 112 registers each, two CTAs per SM): warpgroups 0 and 1 consume, warp 8 produces.
  const int cw = R == 1 ? int(threadIdx.x / 128) - 1 : int(threadIdx.x / 128);  // consumer warpgroup
  if (cw < 0 || cw >= kConsumerWgs) {
    if constexpr (R == 1) setmaxnreg_dec<40>();
    if (R == 2 || threadIdx.x < 32) {
      void* slot = tensor_map_slots[sm_id()];
      if constexpr (R == 2) {
        unsigned sel = 0;
        if (threadIdx.x % 32 == 0) {
          while (atomicCAS(&tensor_map_locks[sm_id()][sel], 0u, 1u) != 0u) sel ^= 1u;
          *slot_sel = sel;
        }
        sel = __shfl_sync(0xffffffffu, sel, 0);
        slot = tensor_map_slots2[sm_id()][sel];
      }
      produce<E, kNT, BN, R, TM, kSub>(sm, A, B, batch, m, n, k, bz, bm, bn, kt0, nt, dyn + Cf::kMapOffset, slot);
    }
    if constexpr (S > 1) {
#pragma unroll
      for (int ch = 0; ch < BN / epilogue_cols<BN, S, TM>(); ++ch) {
        cluster_sync();  // partials written
        cluster_sync_relaxed();  // partials read
      }
    }
    return;
  }
  if constexpr (R == 1) setmaxnreg_inc<232>();
  float d[BN / 2];
  mainloop<E, kNT, BN, R, TM, kSub>(d, sm, nt, cw);
  if (threadIdx.x == 128) KITGEMM_MARK(6);
  const int ctid = threadIdx.x - (R == 1 ? 128 : 0);  // 0 .. kConsumers - 1
  if constexpr (R == 2) {
    if (ctid == 0) {  // every copy has landed: the slot is free again
      __threadfence();
      atomicExch(&tensor_map_locks[sm_id()][*slot_sel], 0u);
    }
  }
  // Epilogue: the accumulators go through a row-major f32 tile in shared memory (the stages are
  // free once both consumer warpgroups are done), in passes of CW columns; then each thread takes
  // 8 consecutive columns of a row: epilogue in f32, one rounding, one 16-byte store. With a
  // split (S > 1) CTA `rank` of the cluster sums rows [rank * TM / S, ...) of its own tile and
  // the other CTAs' partials of those rows: from their shared memory (S = 2) or from the slots
  // they wrote them to (S >= 4).
  constexpr int CW = epilogue_cols<BN, S, TM>(), LD = CW + 8;
  static_assert(TM * LD * 4 <= Cf::kBarrierOffset, "the staging tile fits the dynamic stages");
  static_assert(S == 1 || R == 1, "split-K slots are per SM: one split-K CTA per SM");
  float* tile = reinterpret_cast<float*>(dyn_aligned);
  const int t_in_wg = threadIdx.x % 128, warp = t_in_wg / 32, lane = t_in_wg % 32;
  const int lr = cw * 64 + warp * 16 + lane / 4;
  const bool vec = (n * (int)sizeof(typename Out::T)) % 16 == 0 && kit::aligned16(C);
  constexpr int kRows = TM / S;
  unsigned rank = 0;
  unsigned* my_sm = reinterpret_cast<unsigned*>(dyn_aligned + Cf::kBarrierOffset + 124);
  if constexpr (S > 1) rank = cluster_rank();
  if constexpr (uses_slots<S>()) {
    if (ctid == 0) *my_sm = sm_id();  // read by the other CTAs after the first cluster barrier
  }
  // thread ctid takes u = ctid + i * kConsumers, i < kIters, of the pass's kRows x CW / 8 groups of 8
  constexpr int kGroups = kRows * (CW / 8), kIters = (kGroups + kConsumers - 1) / kConsumers;
  // kBiasHeadsT stores along the rows (C's last dim is seq): consecutive threads take
  // consecutive rows, so a warp's stores of one column are contiguous
  auto row_of = [&](int u) { return int(rank) * kRows + (kEpi == kBiasHeadsT ? u % kRows : u / (CW / 8)); };
  auto col_of = [&](int u) { return (kEpi == kBiasHeadsT ? u / kRows : u % (CW / 8)) * 8; };
  // Loads ahead (into registers, the pass's loop unrolled) for the residual epilogues only: on an
  // H100 (round 38) bias_residual at 2048x3072x768 took 33.1 us against 41.5 for t128x128 and
  // silu_mul 35.9 against 41.6 (run E), but bias-only epilogues gained nothing or lost
  // (bias_gelu_erf 39.3 against 36.2) and silu_mul in two passes (128 x 256) lost (53.7 against
  // 44.1, run C).
  constexpr bool kAhead = EpiTraits<kEpi>::kHasRes && (kEpi != kSiluMul || BN == CW);
#pragma unroll
  for (int ch = 0; ch < BN / CW; ++ch) {
    Ahead<kEpi, Out> ahead[kAhead ? kIters : 1];
    if constexpr (kAhead) {
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int u = ctid + i * kConsumers;
        if (u < kGroups) load_ahead<kEpi, Out>(e, m, n, bm + row_of(u), bn + ch * CW + col_of(u), vec, ahead[i]);
      }
    }
    kit::named_barrier(1, kConsumers);  // the stages, or the previous pass's tile, are free
    stage_pass<BN / CW - 1, CW, LD>(ch, tile, d, lr, lane);
    kit::named_barrier(1, kConsumers);
    if constexpr (uses_slots<S>()) {
      // the rows other CTAs own -> this SM's slot, compacted (16-byte stores, a warp's row-contiguous)
      float* slot = splitk_slots<>[sm_id()];
      for (int u = ctid; u < (TM - kRows) * (CW / 4); u += kConsumers) {
        const int i = u / (CW / 4), c = u % (CW / 4) * 4;
        const int r = i < int(rank) * kRows ? i : i + kRows;
        *reinterpret_cast<float4*>(&slot[i * CW + c]) = *reinterpret_cast<const float4*>(&tile[r * LD + c]);
      }
    }
    if constexpr (S > 1) cluster_sync();  // release: the partials (slots, shared memory) are visible to the cluster
    if (threadIdx.x == 128 && ch == 0) KITGEMM_MARK(8);
    const float* slots[S];
    if constexpr (uses_slots<S>()) {
#pragma unroll
      for (int q = 0; q < S; ++q) slots[q] = splitk_slots<>[ld_cluster_u32(kit::smem_addr(my_sm), q)];
    }
    // group u of 8 columns: its sums (split-K: of every partial), epilogue, store
    auto group = [&](int u, const Ahead<kEpi, Out>* ahead_u) {
      const int r = row_of(u), c = col_of(u);
      float v[8];
      if constexpr (S == 1) {
        const float4 x = *reinterpret_cast<const float4*>(&tile[r * LD + c]);
        const float4 y = *reinterpret_cast<const float4*>(&tile[r * LD + c + 4]);
        v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w, v[4] = y.x, v[5] = y.y, v[6] = y.z, v[7] = y.w;
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = 0.f;
#pragma unroll
        for (int q = 0; q < S; ++q) {  // in rank order, as the sum over k runs
          float4 x, y;
          if (q == int(rank)) {
            x = *reinterpret_cast<const float4*>(&tile[r * LD + c]);
            y = *reinterpret_cast<const float4*>(&tile[r * LD + c + 4]);
          } else if constexpr (!uses_slots<S>()) {
            const unsigned addr = kit::smem_addr(&tile[r * LD + c]);
            x = ld_cluster_v4(addr, q), y = ld_cluster_v4(addr + 16, q);
          } else {
            const float* p = slots[q] + (r < q * kRows ? r : r - kRows) * CW + c;
            x = __ldcg(reinterpret_cast<const float4*>(p));  // L2: written by another SM
            y = __ldcg(reinterpret_cast<const float4*>(p + 4));
          }
          v[0] += x.x, v[1] += x.y, v[2] += x.z, v[3] += x.w, v[4] += y.x, v[5] += y.y, v[6] += y.z, v[7] += y.w;
        }
      }
      store8<kEpi, Out>(C, e, m, n, bm + r, bn + ch * CW + c, v, vec, ahead_u);
    };
    if constexpr (kAhead) {
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        if (ctid + i * kConsumers < kGroups) group(ctid + i * kConsumers, &ahead[i]);
      }
    } else {
      for (int u = ctid; u < kGroups; u += kConsumers) group(u, nullptr);
    }
    if (threadIdx.x == 128) KITGEMM_MARK(9);
    if constexpr (S > 1) cluster_sync_relaxed();  // the partials are read: the CTAs may reuse them or leave
  }
  if (threadIdx.x == 128) {
    KITGEMM_MARK(7);
    KITGEMM_MARK(11, true);
  }
}

// ------------------------------------------------------------ persistent (one CTA per SM)
// Grid of a fixed number of CTAs (the manifest asks for 132, one per H100 SM; any grid is
// correct): CTA i takes tiles i, i + grid, ... The maps are built once per CTA, the producer
// runs ahead across tile boundaries (the ring's phase counts k slices over all tiles). The two
// consumer warpgroups take turns ("ping-pong", as CUTLASS's KernelTmaWarpSpecializedPingpong):
// each computes a whole tile of its own, so one's epilogue runs while the other's wgmmas keep
// the tensor cores busy (H200, K = 768: 4-19% faster than both warpgroups sharing each tile with
// light epilogues, slower with GELU or SiLU: kPingPong false keeps the cooperative schedule;
// benchmarks/results/gemm-mid-h200-round32.txt). The epilogue goes through a per-warp f32
// staging area (16 rows x 32 columns a pass, its own shared memory: the stages stay in use),
// then 16-byte stores as in block().
template <int BN>
struct PCfg {
  static constexpr int BK = 64;
  static constexpr int kABytes = BM * BK * 2, kBBytes = BN * BK * 2, kStageBytes = kABytes + kBBytes;
  static constexpr int kLD = 36;  // staging row pitch (floats)
  static constexpr int kStagingBytes = 8 * 16 * kLD * 4;
  static constexpr int kFit = 1 + (kDynamicSmem - 1023 - 128 - 2 * kTensorMapBytes - kStagingBytes) / kStageBytes;
  static constexpr int kStages = kFit < kMaxStages ? kFit : kMaxStages;
  static constexpr int kStagingOffset = (kStages - 1) * kStageBytes;
  static constexpr int kBarrierOffset = kStagingOffset + kStagingBytes;
  static constexpr int kMapOffset = kBarrierOffset + 128;
  static_assert(kStages >= 3, "pipeline depth");
  static_assert(kStageBytes + kDynamicSmem <= 227 * 1024, "a block's shared memory");
  static_assert(1023 + kMapOffset + 2 * kTensorMapBytes <= kDynamicSmem, "dynamic shared memory layout");
  static_assert(kDynamicSmem + kStageBytes > 227 * 1024 / 2, "one block per SM (the tensor-map slots rely on it)");
};

__device__ __forceinline__ void tile_of(int id, int tiles_m, int tiles_n, int& bz, int& tm, int& tn) {
  const int per = tiles_m * tiles_n;
  bz = id / per;
  id -= bz * per;
  const int band = id / (kBand * tiles_n), first = band * kBand;
  const int rows = min(tiles_m - first, kBand);
  const int in_band = id % (kBand * tiles_n);
  tm = first + in_band % rows;
  tn = in_band / rows;
}

// Columns [32 P, 32 P + 32) of this warp's 16 rows: registers -> staging -> epilogue -> C, lane
// `lane` taking rows lane / 4 and lane / 4 + 8 (u = lane, lane + 32) at columns lane % 4 * 8 ..
// + 7, their bias and residual from ahead[2 P], ahead[2 P + 1].
template <int P, int kEpi, class Out, int N>
__device__ __forceinline__ void warp_epilogue_pass(float* stg, const float (&d)[N], int lane, typename Out::T* C,
                                                   const EpiArgs<Out>& e, int m, int n, int row0, int col0, bool vec,
                                                   const Ahead<kEpi, Out>* ahead) {
  constexpr int LD = PCfg<128>::kLD;
  __syncwarp();
#pragma unroll
  for (int jj = 0; jj < 4; ++jj) {
    const int j = 4 * P + jj, c = jj * 8 + 2 * (lane % 4), r = lane / 4;
    *reinterpret_cast<float2*>(&stg[r * LD + c]) = make_float2(d[4 * j], d[4 * j + 1]);
    *reinterpret_cast<float2*>(&stg[(r + 8) * LD + c]) = make_float2(d[4 * j + 2], d[4 * j + 3]);
  }
  __syncwarp();
#pragma unroll
  for (int u = lane; u < 64; u += 32) {
    const int r = u / 4, c = u % 4 * 8;
    const float4 x = *reinterpret_cast<const float4*>(&stg[r * LD + c]);
    const float4 y = *reinterpret_cast<const float4*>(&stg[r * LD + c + 4]);
    float v[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
    store8<kEpi, Out>(C, e, m, n, row0 + r, col0 + c, v, vec, ahead ? &ahead[2 * P + u / 32] : nullptr);
  }
}

// A warp's 16 rows x 128 columns of C from the accumulators of one 64-row band (four passes).
// Every bias and residual load of the four passes is issued first (Ahead), each bias word once:
// H100, round 38, at 2048x3072x768 bias 21.1 us against 23.9, bias_residual 25.9 against 39.1,
// bias_silu 26.7 against 30.1 (benchmarks/results/gemm-epilogue-h100-round38.txt, run E).
template <int kEpi, class Out, int N>
__device__ __forceinline__ void warp_epilogue_band(float* stg, const float (&d)[N], int lane, typename Out::T* C,
                                                   const EpiArgs<Out>& e, int m, int n, int row0, int col0, bool vec) {
  constexpr bool kAhead = EpiTraits<kEpi>::kHasBias || EpiTraits<kEpi>::kHasRes;
  Ahead<kEpi, Out> ahead[kAhead ? 8 : 1];
  if constexpr (kAhead) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int u = lane + 32 * (i % 2);
      load_ahead<kEpi, Out>(e, m, n, row0 + u / 4, col0 + 32 * (i / 2) + u % 4 * 8, vec, ahead[i], i % 2 == 0);
      // the same columns as ahead[i - 1]: its bias (registers for 4 bias words, not 8: with 8
      // bias_residual's ping-pong entry spilled)
      if (i % 2 == 1) {
#pragma unroll
        for (int w = 0; w < Ahead<kEpi, Out>::kWords; ++w) ahead[i].bias[w] = ahead[i - 1].bias[w];
      }
    }
  }
  const Ahead<kEpi, Out>* a = kAhead ? ahead : nullptr;
  warp_epilogue_pass<0, kEpi, Out>(stg, d, lane, C, e, m, n, row0, col0 + 0, vec, a);
  warp_epilogue_pass<1, kEpi, Out>(stg, d, lane, C, e, m, n, row0, col0 + 32, vec, a);
  warp_epilogue_pass<2, kEpi, Out>(stg, d, lane, C, e, m, n, row0, col0 + 64, vec, a);
  warp_epilogue_pass<3, kEpi, Out>(stg, d, lane, C, e, m, n, row0, col0 + 96, vec, a);
}

// Consumer warpgroup cw takes this CTA's tiles j = cw, cw + 2, ... whole: two 64-row bands, 128
// accumulators a thread. A warpgroup starts waiting on its tile's stages only once the other
// has waited on all of the previous tile's (named barriers 2 and 3, a handoff each way): a
// stage's full barrier is then at most one phase behind the slice waited for, which the parity
// wait needs (two behind would read as done).
template <class E, class Out, bool kNT, int BN, int kEpi>
__device__ __forceinline__ void pingpong_consume(const Smem& sm, typename Out::T* C, const EpiArgs<Out>& e, int m,
                                                 int n, int total, int tiles_m, int tiles_n, int ktiles, int cw,
                                                 float* stg) {
  using Cf = PCfg<BN>;
  const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
  const bool vec = (n * (int)sizeof(typename Out::T)) % 16 == 0 && kit::aligned16(C);
  const int mine = total > int(blockIdx.x) ? (total - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
  float d0[BN / 2], d1[BN / 2];
  for (int j = cw; j < mine; j += 2) {
    int bz, tm, tn;
    tile_of(int(blockIdx.x) + j * int(gridDim.x), tiles_m, tiles_n, bz, tm, tn);
    const int bm = tm * BM, bn = tn * BN;
    if (j > 0) kit::named_barrier(2 + cw, 256);  // the other warpgroup has all of tile j - 1's stages
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) d0[i] = 0.f, d1[i] = 0.f;
    consume_slices<Cf::kStages>(sm, j * ktiles, ktiles, true, [&](int s, int t) {
      if (t == ktiles - 1 && j + 1 < mine) kit::named_barrier_arrive(3 - cw, 256);  // hand over
      slice_mma<E, kNT, BN>(d0, sm.a(s), sm.b(s));
      slice_mma<E, kNT, BN>(d1, sm.a(s) + 64 * Cf::BK * 2, sm.b(s));
    });
    typename Out::T* Cb = C + (long long)bz * m * n;
    EpiArgs<Out> eb = e;
    if constexpr (EpiTraits<kEpi>::kHasRes) eb.res += (long long)bz * m * n;
    const int row0 = bm + warp * 16;
    warp_epilogue_band<kEpi, Out>(stg, d0, lane, Cb, eb, m, n, row0, bn, vec);
    warp_epilogue_band<kEpi, Out>(stg, d1, lane, Cb, eb, m, n, row0 + 64, bn, vec);
  }
}

// Cooperative consumers: both warpgroups on every tile, 64 rows each, both in the epilogue.
template <class E, class Out, bool kNT, int BN, int kEpi>
__device__ __forceinline__ void cooperative_consume(const Smem& sm, typename Out::T* C, const EpiArgs<Out>& e, int m,
                                                    int n, int total, int tiles_m, int tiles_n, int ktiles, int cw,
                                                    float* stg) {
  using Cf = PCfg<BN>;
  const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
  const bool vec = (n * (int)sizeof(typename Out::T)) % 16 == 0 && kit::aligned16(C);
  int g = 0;
  float d[BN / 2];
  for (int tile = blockIdx.x; tile < total; tile += gridDim.x, g += ktiles) {
    int bz, tm, tn;
    tile_of(tile, tiles_m, tiles_n, bz, tm, tn);
    const int bm = tm * BM, bn = tn * BN;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) d[i] = 0.f;
    consume_slices<Cf::kStages>(sm, g, ktiles, true, [&](int s, int) {
      slice_mma<E, kNT, BN>(d, sm.a(s) + cw * 64 * Cf::BK * 2, sm.b(s));
    });
    typename Out::T* Cb = C + (long long)bz * m * n;
    EpiArgs<Out> eb = e;
    if constexpr (EpiTraits<kEpi>::kHasRes) eb.res += (long long)bz * m * n;
    const int row0 = bm + cw * 64 + warp * 16;
    warp_epilogue_band<kEpi, Out>(stg, d, lane, Cb, eb, m, n, row0, bn, vec);
  }
}

template <class E, class Out, bool kNT, int BN, int kEpi, bool kPingPong>
__device__ void persistent(const half_bits* A, const half_bits* B, typename Out::T* C, EpiArgs<Out> e, int batch, int m,
                           int n, int k, unsigned stage0, char* dyn_smem) {
  static_assert(BN == 128, "the persistent epilogue passes are written for 128 columns");
  using Cf = PCfg<BN>;
  const unsigned dyn = (kit::smem_addr(dyn_smem) + 1023) & ~1023u;
  char* dyn_aligned = dyn_smem + (dyn - kit::smem_addr(dyn_smem));
  Smem sm{stage0, dyn, Cf::kStageBytes, Cf::kABytes, 1,
          reinterpret_cast<unsigned long long*>(dyn_aligned + Cf::kBarrierOffset),
          reinterpret_cast<unsigned long long*>(dyn_aligned + Cf::kBarrierOffset) + Cf::kStages};
  const int tiles_m = (m + BM - 1) / BM, tiles_n = (n + BN - 1) / BN, total = batch * tiles_m * tiles_n;
  const int ktiles = (k + Cf::BK - 1) / Cf::BK;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Cf::kStages; ++s) {
      mbar_init(&sm.full[s], 1);
      mbar_init(&sm.empty[s], kPingPong ? 1 : 2);  // freed by the warpgroups that read it
    }
    mbar_init_fence();
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    void* map_a = tensor_map_slots[sm_id()];
    void* map_b = static_cast<char*>(map_a) + kTensorMapBytes;
    const unsigned maps = dyn + Cf::kMapOffset;
    if (lane == 0) {
      tensor_map_3d<E>(maps, A, k, m, batch, Cf::BK, BM);
      if constexpr (kNT) {
        tensor_map_3d<E>(maps + kTensorMapBytes, B, k, n, batch, Cf::BK, BN);
      } else {
        tensor_map_3d<E>(maps + kTensorMapBytes, B, n, k, batch, 64, Cf::BK);
      }
    }
    __syncwarp();
    tensor_map_publish(map_a, maps);
    tensor_map_publish(map_b, maps + kTensorMapBytes);
    if (lane != 0) return;
    tensor_map_acquire(map_a);
    tensor_map_acquire(map_b);
    int g = 0;
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
      int bz, tm, tn;
      tile_of(tile, tiles_m, tiles_n, bz, tm, tn);
      const int bm = tm * BM, bn = tn * BN;
      for (int t = 0; t < ktiles; ++t, ++g) {
        const int s = g % Cf::kStages;
        const int k0 = t * Cf::BK;
        mbar_wait(&sm.empty[s], ((g / Cf::kStages) & 1) ^ 1);
        mbar_arrive_expect_tx(&sm.full[s], Cf::kStageBytes);
        tma_load_3d(sm.a(s), map_a, k0, bm, bz, &sm.full[s]);
        if constexpr (kNT) {
          tma_load_3d(sm.b(s), map_b, k0, bn, bz, &sm.full[s]);
        } else {
#pragma unroll
          for (int j = 0; j < BN / 64; ++j) tma_load_3d(sm.b(s) + j * 64 * Cf::BK * 2, map_b, bn + j * 64, k0, bz, &sm.full[s]);
        }
      }
    }
    return;
  }
  setmaxnreg_inc<232>();
  const int cw = wg - 1, warp = threadIdx.x % 128 / 32;
  float* stg = reinterpret_cast<float*>(dyn_aligned + Cf::kStagingOffset) + (cw * 4 + warp) * 16 * Cf::kLD;
  if constexpr (kPingPong) {
    pingpong_consume<E, Out, kNT, BN, kEpi>(sm, C, e, m, n, total, tiles_m, tiles_n, ktiles, cw, stg);
  } else {
    cooperative_consume<E, Out, kNT, BN, kEpi>(sm, C, e, m, n, total, tiles_m, tiles_n, ktiles, cw, stg);
  }
}

__device__ __forceinline__ bool takes_tma(const void* A, const void* B, bool nt, int n, int k, unsigned stage0) {
  return k > 0 && k % 8 == 0 && (nt || n % 8 == 0) && kit::aligned16(A) && kit::aligned16(B) &&
         sm_id() < kTensorMapSlots && (stage0 & 1023) == 0;
}

}  // namespace hopper
#endif

// The kernel body of every entry. A, B, C, e.res: the first batch's (base) pointers.
template <class E, class Out, bool kNT, int BN, int S, int kEpi, int R = 1, int TM = BM>
__device__ __forceinline__ void gemm(const half_bits* A, const half_bits* B, typename Out::T* C, EpiArgs<Out> e,
                                     int batch, int m, int n, int k) {
  extern __shared__ __align__(1024) char dyn_smem[];
  require_dynamic_smem();
  prepare_heads<kEpi, Out>(e);
  int tile_m, tile_n;
  block_tile(tile_m, tile_n);
  const int bm = tile_m * TM, bn = tile_n * BN;
  const int bz = blockIdx.z / S, split = blockIdx.z % S;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(1024) char stage0[hopper::Cfg<BN, R, TM, hopper::stage_boxes<TM, S, BN>()>::kStaticBytes];
  const unsigned s0 = kit::smem_addr(stage0);
  if (hopper::takes_tma(A, B, kNT, n, k, s0)) {
    if constexpr (EpiTraits<kEpi>::kHasRes) e.res += (long long)bz * m * n;
    hopper::block<E, Out, kNT, BN, S, kEpi, R, TM>(A, B, C + (long long)bz * m * n, e, batch, m, n, k, bz, split, bm, bn, s0,
                                            dyn_smem);
    return;
  }
#endif
  if (split != 0) return;  // the mma.sync path does the whole k in split 0
  if constexpr (EpiTraits<kEpi>::kHasRes) e.res += (long long)bz * m * n;
  ampere::block<E, Out, kNT, BN, kEpi, R == 1 ? ampere::kGroups : 2, TM>(A + (long long)bz * m * k, B + (long long)bz * k * n, C + (long long)bz * m * n,
                                       e, m, n, k, bm, bn, dyn_smem);
}

// The persistent entries' body (config t128x128_p): BN = 128, no split, grid of any size.
// kPingPong: the consumers take turns (configs.pingpong(epilogue) says which entries).
template <class E, class Out, bool kNT, int BN, int kEpi, bool kPingPong>
__device__ __forceinline__ void gemm_persistent(const half_bits* A, const half_bits* B, typename Out::T* C,
                                                EpiArgs<Out> e, int batch, int m, int n, int k) {
  extern __shared__ __align__(1024) char dyn_smem[];
  require_dynamic_smem();
  prepare_heads<kEpi, Out>(e);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(1024) char stage0[hopper::PCfg<BN>::kStageBytes];
  const unsigned s0 = kit::smem_addr(stage0);
  if (hopper::takes_tma(A, B, kNT, n, k, s0)) {
    hopper::persistent<E, Out, kNT, BN, kEpi, (kPingPong || KITGEMM_PERSISTENT_PINGPONG) && !KITGEMM_PERSISTENT_COOPERATIVE>(A, B, C, e, batch, m, n, k, s0,
                                                                                          dyn_smem);
    return;
  }
#endif
  const int tiles_m = (m + BM - 1) / BM, tiles_n = (n + BN - 1) / BN, total = batch * tiles_m * tiles_n;
  for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const int per = tiles_m * tiles_n, bz = tile / per, id = tile - bz * per;
    const int tm = id / tiles_n, tn = id % tiles_n;
    EpiArgs<Out> eb = e;
    if constexpr (EpiTraits<kEpi>::kHasRes) eb.res += (long long)bz * m * n;
    ampere::block<E, Out, kNT, BN, kEpi>(A + (long long)bz * m * k, B + (long long)bz * k * n, C + (long long)bz * m * n,
                                         eb, m, n, k, tm * BM, tn * BN, dyn_smem);
  }
}

}  // namespace kitgemm
