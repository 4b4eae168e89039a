// Tensor-core matmul: A f16[m, k] x B f16[k, n] -> C f32[m, n] (and the same for bf16),
// row-major, f32 accumulation. Needs sm_80 or newer.
//
// CONTRACT: m, n and k must be multiples of 16. Otherwise every element of C is NaN: loud,
// rather than silently wrong (the 16-byte loads need rows of a multiple of 8 halves).
//
// Header-free: kitdispatch gives NVRTC no CUDA include directory, and NVRTC 13.0 cannot find
// <mma.h>, <cuda_fp16.h> or <cuda_bf16.h> without one, so nvcuda::wmma and __half are out.
// Halves travel as raw 16-bit words and the tensor cores are driven with PTX: cp.async (global
// to shared, 16 bytes, zero-filled past the edges), ldmatrix (shared to fragments) and
// mma.sync.m16n8k16 (the instruction WMMA's 16x16x16 lowers to on sm_80+).
//
// Tiling: a block of 4 warps computes a 64 x 64 tile of C, each warp 32 x 32 (2 x 4 mma tiles of
// 16 x 8), stepping k by 32 with two shared-memory stages, so the next tile's copies overlap the
// current tile's math.

namespace {

constexpr int kThreads = 128;
constexpr int BM = 64, BN = 64, BK = 32;
// Shared rows padded by 8 halves (16 bytes): the 8 row addresses of each ldmatrix then fall in
// 8 different 4-bank groups (A rows 80 bytes apart, B rows 144 bytes apart): no bank conflicts.
constexpr int A_STRIDE = BK + 8;
constexpr int B_STRIDE = BN + 8;

typedef unsigned short half_bits;  // an f16 or bf16 as stored

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronous; copies zeros instead when !valid.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Four 8x8 b16 matrices from shared memory; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const half_bits* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const half_bits* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d += a (16x16, row) * b (16x8, col), f32 accumulators.
template <bool kBf16>
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <bool kBf16>
__device__ __forceinline__ void matmul_tile(const half_bits* __restrict__ A, const half_bits* __restrict__ B,
                                            float* __restrict__ C, int m, int n, int k) {
  __shared__ __align__(16) half_bits As[2][BM][A_STRIDE];
  __shared__ __align__(16) half_bits Bs[2][BK][B_STRIDE];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;

  if ((m | n | k) % 16 != 0) {  // outside the contract: NaN, not garbage
    for (int i = tid; i < BM * BN; i += kThreads) {
      const int r = bm + i / BN, c = bn + i % BN;
      if (r < m && c < n) C[(long long)r * n + c] = __int_as_float(0x7fc00000);
    }
    return;
  }

  // Stage one BM x BK tile of A and one BK x BN tile of B, 8 halves (16 bytes) per copy.
  auto load_tiles = [&](int stage, int k0) {
    for (int i = tid; i < BM * BK / 8; i += kThreads) {
      const int r = i / (BK / 8), kc = i % (BK / 8) * 8;
      const bool ok = bm + r < m && k0 + kc < k;
      cp_async16(&As[stage][r][kc], ok ? A + (long long)(bm + r) * k + k0 + kc : A, ok);
    }
    for (int i = tid; i < BK * BN / 8; i += kThreads) {
      const int r = i / (BN / 8), nc = i % (BN / 8) * 8;
      const bool ok = k0 + r < k && bn + nc < n;
      cp_async16(&Bs[stage][r][nc], ok ? B + (long long)(k0 + r) * n + bn + nc : B, ok);
    }
    cp_async_commit();
  };

  const int wm = warp / 2 * 32, wn = warp % 2 * 32;  // this warp's 32 x 32 of the block tile
  float acc[2][4][4] = {};
  const int ktiles = (k + BK - 1) / BK;
  if (ktiles > 0) load_tiles(0, 0);
  for (int t = 0; t < ktiles; ++t) {
    if (t + 1 < ktiles) {
      load_tiles((t + 1) % 2, (t + 1) * BK);
      cp_async_wait<1>();  // tile t has landed; tile t + 1 is still in flight
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int s = t % 2;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      unsigned a[2][4], b[4][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) ldmatrix_x4(a[i], &As[s][wm + i * 16 + lane % 16][kk + lane / 16 * 8]);
#pragma unroll
      for (int j = 0; j < 2; ++j) {  // two 16 x 8 B fragments per ldmatrix: columns +0 and +8
        unsigned r[4];
        ldmatrix_x4_trans(r, &Bs[s][kk + lane % 16][wn + j * 16 + lane / 16 * 8]);
        b[2 * j][0] = r[0], b[2 * j][1] = r[1], b[2 * j + 1][0] = r[2], b[2 * j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_16x8x16<kBf16>(acc[i][j], a[i], b[j][0], b[j][1]);
    }
    __syncthreads();  // the stage is refilled next iteration
  }

  // Accumulator layout of m16n8: lane holds rows lane/4 and lane/4 + 8, columns 2 * (lane % 4) + {0, 1}.
  const int g = lane / 4, c2 = lane % 4 * 2;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = bm + wm + i * 16 + g, c = bn + wn + j * 8 + c2;
      if (c >= n) continue;
      if (r < m) *reinterpret_cast<float2*>(C + (long long)r * n + c) = make_float2(acc[i][j][0], acc[i][j][1]);
      if (r + 8 < m)
        *reinterpret_cast<float2*>(C + (long long)(r + 8) * n + c) = make_float2(acc[i][j][2], acc[i][j][3]);
    }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads)
matmul_f16(const half_bits* __restrict__ a, const half_bits* __restrict__ b, float* __restrict__ c, int m, int n, int k) {
  matmul_tile<false>(a, b, c, m, n, k);
}

extern "C" __global__ void __launch_bounds__(kThreads)
matmul_bf16(const half_bits* __restrict__ a, const half_bits* __restrict__ b, float* __restrict__ c, int m, int n, int k) {
  matmul_tile<true>(a, b, c, m, n, k);
}
