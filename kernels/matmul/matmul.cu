// Tensor-core matmul: C[m, n] = A[m, k] x B[k, n], row-major, f16 or bf16 inputs, f32
// accumulation, C stored as f32, f16 or bf16. Any m, n, k (edges are masked).
//
// One source, two code paths, one launch: blocks of 384 threads, each owning a 128 x 256 tile
// of C (grid ceildiv(n, 256) x ceildiv(m, 128)), with the manifest's dynamic shared memory.
//
// - sm_90a (H100/H200; `__CUDA_ARCH_FEAT_SM90_ALL`): warp-specialized. Warpgroup 0 is the
//   producer: one thread builds TMA tensor maps for A and B on the device, then streams 64-deep
//   k slices of A (128 x 64) and B (64 x 256) into a 3-stage ring of 48 KB stages with the copy
//   engine (cp.async.bulk.tensor, 128-byte swizzle, zeros past the edges), each stage guarded by
//   a pair of mbarriers (full: the copies landed; empty: both consumers are done with it).
//   Warpgroups 1 and 2 are the consumers: each multiplies its 64 rows of the stage with
//   wgmma.m64n256k16 (both operands from shared memory, B N-major), keeping one wgmma group in
//   flight, and writes its 64 x 256 f32 accumulators straight to C. setmaxnreg moves registers
//   from the producer (40) to the consumers (232).
// - sm_80..sm_89, and sm_90a for shapes the copy engine cannot take (k or n not a multiple of 8,
//   misaligned pointers): three groups of 4 warps, each computing 64 x 64 sub-tiles of the
//   block's tile with mma.sync.m16n8k16 (ldmatrix fragments, a 3-stage cp.async pipeline of
//   32-deep k slices; element-wise loads when rows are not 16-byte aligned).
//
// Shared memory: the sm_90a path needs 3 x 48 KB; the manifest declares 98 KB of dynamic memory
// (sm_86/89 allow at most 99 KB a block) and the sm_90a code adds stage 0 as a 48 KB static
// array, so the module loads on every GPU from sm_80 on. Dynamic shared memory of more than half
// an SM also guarantees one block per SM, which the device-built tensor maps rely on
// (kit_sm90.cuh).

#include "../common/kit_mma.cuh"
#include "../common/kit_sm90.cuh"

namespace {

using kit::half_bits;

constexpr int kThreads = 384;
constexpr int BM = 128, BN = 256;  // the block's tile of C, both paths
constexpr int kDynamicSmem = 100352;  // kitdispatch.toml's dynamic_shared_memory

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

template <class Out>
__device__ __forceinline__ bool pairs_aligned(const typename Out::T* c, int n) {
  return n % 2 == 0 && (reinterpret_cast<unsigned long long>(c) % (2 * sizeof(typename Out::T))) == 0;
}

// ============================================================ mma.sync path (sm_80 and up)

namespace ampere {

constexpr int SUB = 64, BK = 32, kStages = 3, kGroupThreads = 128;
constexpr int kGroups = kThreads / kGroupThreads;
// Shared rows padded by 8 halves (16 bytes): the 8 row addresses of each ldmatrix then fall in
// 8 different 4-bank groups (A rows 80 bytes apart, B rows 144 bytes apart): no bank conflicts.
constexpr int A_STRIDE = BK + 8, B_STRIDE = SUB + 8;
constexpr int kStageHalves = SUB * A_STRIDE + BK * B_STRIDE;
constexpr int kGroupBytes = kStages * kStageHalves * 2;
static_assert(kGroups * kGroupBytes <= kDynamicSmem, "the groups' stages fit the dynamic shared memory");

struct Sub {
  const half_bits* A;
  const half_bits* B;
  int m, n, k;
  bool vec;  // 16-byte rows: cp.async; else element-wise loads
};

// One BK-deep k slice of the sub-tile at (sm, sn) into a stage, by the group's 128 threads.
__device__ __forceinline__ void load_stage(const Sub& p, half_bits* As, half_bits* Bs, int sm, int sn, int k0, int gtid) {
  for (int i = gtid; i < SUB * BK / 8; i += kGroupThreads) {
    const int r = i / (BK / 8), c = i % (BK / 8) * 8;
    half_bits* dst = As + r * A_STRIDE + c;
    const int row = sm + r, col = k0 + c;
    if (p.vec) {
      const bool ok = row < p.m && col < p.k;
      kit::cp_async16(dst, ok ? p.A + (long long)row * p.k + col : p.A, ok);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[e] = row < p.m && col + e < p.k ? p.A[(long long)row * p.k + col + e] : 0;
    }
  }
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

// acc += the stage's A (64 x BK) x B (BK x 64) for this warp's 32 x 32.
template <class E>
__device__ __forceinline__ void mma_stage(float (&acc)[2][4][4], const half_bits* As, const half_bits* Bs, int wm,
                                          int wn, int lane) {
#pragma unroll
  for (int kk = 0; kk < BK; kk += 16) {
    unsigned a[2][4], b[4][2];
#pragma unroll
    for (int i = 0; i < 2; ++i) kit::ldmatrix_x4(a[i], As + (wm + i * 16 + lane % 16) * A_STRIDE + kk + lane / 16 * 8);
#pragma unroll
    for (int j = 0; j < 2; ++j) {  // two 16 x 8 B fragments per ldmatrix: columns +0 and +8
      unsigned r[4];
      kit::ldmatrix_x4_trans(r, Bs + (kk + lane % 16) * B_STRIDE + wn + j * 16 + lane / 16 * 8);
      b[2 * j][0] = r[0], b[2 * j][1] = r[1], b[2 * j + 1][0] = r[2], b[2 * j + 1][1] = r[3];
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) kit::mma_16x8x16<E>(acc[i][j], a[i], b[j][0], b[j][1]);
  }
}

// The 64 x 64 sub-tile of C at (sm, sn), by one group of 4 warps (named barrier `bar`).
template <class E, class Out>
__device__ void sub_tile(const Sub& p, typename Out::T* C, int sm, int sn, half_bits* smem, int bar) {
  const int gtid = threadIdx.x % kGroupThreads, warp = gtid / 32, lane = gtid % 32;
  const int wm = warp / 2 * 32, wn = warp % 2 * 32;  // this warp's 32 x 32 of the sub-tile
  auto stage_a = [&](int s) { return smem + s * kStageHalves; };
  auto stage_b = [&](int s) { return smem + s * kStageHalves + SUB * A_STRIDE; };
  float acc[2][4][4] = {};
  const int ktiles = (p.k + BK - 1) / BK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load_stage(p, stage_a(s), stage_b(s), sm, sn, s * BK, gtid);
    kit::cp_async_commit();
  }
  for (int t = 0; t < ktiles; ++t) {
    kit::cp_async_wait<kStages - 2>();  // slice t has landed
    kit::named_barrier(bar, kGroupThreads);  // ... for every warp, and slice t - 1 is free
    const int next = t + kStages - 1;
    if (next < ktiles) load_stage(p, stage_a(next % kStages), stage_b(next % kStages), sm, sn, next * BK, gtid);
    kit::cp_async_commit();
    mma_stage<E>(acc, stage_a(t % kStages), stage_b(t % kStages), wm, wn, lane);
  }
  kit::cp_async_wait<0>();
  kit::named_barrier(bar, kGroupThreads);  // the next sub-tile refills the stages

  const bool paired = pairs_aligned<Out>(C, p.n);
  const int g = lane / 4, c2 = lane % 4 * 2;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = sm + wm + i * 16 + g, c = sn + wn + j * 8 + c2;
      if (c >= p.n) continue;
      if (r < p.m) kit::store_pair<Out>(C + (long long)r * p.n + c, acc[i][j][0], acc[i][j][1], c + 1 < p.n, paired);
      if (r + 8 < p.m)
        kit::store_pair<Out>(C + (long long)(r + 8) * p.n + c, acc[i][j][2], acc[i][j][3], c + 1 < p.n, paired);
    }
}

// The block's 128 x 256 tile as 8 sub-tiles of 64 x 64, dealt round-robin to the 3 groups.
template <class E, class Out>
__device__ void block(const half_bits* A, const half_bits* B, typename Out::T* C, int m, int n, int k, int bm, int bn,
                      char* smem) {
  const int group = threadIdx.x / kGroupThreads;
  const bool vec = k % 8 == 0 && n % 8 == 0 && kit::aligned16(A) && kit::aligned16(B);
  const Sub p{A, B, m, n, k, vec};
  half_bits* mine = reinterpret_cast<half_bits*>(smem + group * kGroupBytes);
  for (int s = group; s < (BM / SUB) * (BN / SUB); s += kGroups) {
    const int sm = bm + s / (BN / SUB) * SUB, sn = bn + s % (BN / SUB) * SUB;
    if (sm < m && sn < n) sub_tile<E, Out>(p, C, sm, sn, mine, 1 + group);
  }
}

}  // namespace ampere

// ============================================================ wgmma + TMA path (sm_90a)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace hopper {

using namespace kit::sm90;

constexpr int BK = 64, kStages = 3;
constexpr int kABytes = BM * BK * 2, kBBytes = BK * BN * 2, kStageBytes = kABytes + kBBytes;  // 16 + 32 KB
constexpr int kBBox = 64;  // B arrives as BN / 64 boxes of 64 columns x BK rows: 128-byte rows
// Dynamic part: stages 1..2, then the barriers and the maps' staging, after up to 1 KB of
// padding to the 1024-byte alignment the 128-byte swizzle needs.
constexpr int kBarrierOffset = (kStages - 1) * kStageBytes;
constexpr int kMapOffset = kBarrierOffset + 128;
static_assert(1023 + kMapOffset + 2 * kTensorMapBytes <= kDynamicSmem, "dynamic shared memory layout");
static_assert(kDynamicSmem > 227 * 1024 / 2 - kStageBytes, "one block per SM (the tensor-map slots rely on it)");

__device__ __align__(128) unsigned char tensor_map_slots[kTensorMapSlots][2][kTensorMapBytes];

struct Smem {
  unsigned stage0, dyn;  // shared addresses, 1024-aligned
  unsigned long long* full;
  unsigned long long* empty;
  __device__ unsigned a(int s) const { return s == 0 ? stage0 : dyn + (s - 1) * kStageBytes; }
  __device__ unsigned b(int s) const { return a(s) + kABytes; }
};

// Warp 0 of the producer warpgroup: builds and publishes the maps, then (lane 0) keeps the ring
// full.
template <class E>
__device__ void produce(const Smem& sm, const half_bits* A, const half_bits* B, int m, int n, int k, int bm, int bn,
                        unsigned maps, void* slot) {
  const int lane = threadIdx.x % 32;
  void* map_a = slot;
  void* map_b = static_cast<char*>(slot) + kTensorMapBytes;
  if (lane == 0) {
    tensor_map_2d<E>(maps, A, k, m, BK, BM);
    tensor_map_2d<E>(maps + kTensorMapBytes, B, n, k, kBBox, BK);
  }
  __syncwarp();
  tensor_map_publish(map_a, maps);
  tensor_map_publish(map_b, maps + kTensorMapBytes);
  if (lane != 0) return;
  tensor_map_acquire(map_a);
  tensor_map_acquire(map_b);
  const int ktiles = (k + BK - 1) / BK;
  for (int t = 0; t < ktiles; ++t) {
    const int s = t % kStages;
    mbar_wait(&sm.empty[s], ((t / kStages) & 1) ^ 1);  // the first pass finds every stage free
    mbar_arrive_expect_tx(&sm.full[s], kStageBytes);
    tma_load_3d(sm.a(s), map_a, t * BK, bm, 0, &sm.full[s]);
#pragma unroll
    for (int j = 0; j < BN / kBBox; ++j) tma_load_3d(sm.b(s) + j * kBBox * BK * 2, map_b, bn + j * kBBox, t * BK, 0, &sm.full[s]);
  }
}

// Consumer warpgroup `wg` (0 or 1): rows 64 * wg .. + 64 of the tile.
template <class E, class Out>
__device__ void consume(const Smem& sm, typename Out::T* C, int m, int n, int k, int bm, int bn, int wg) {
  float d[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.f;
  const int t_in_wg = threadIdx.x % 128;
  const int ktiles = (k + BK - 1) / BK;
  for (int t = 0; t < ktiles; ++t) {
    const int s = t % kStages;
    mbar_wait(&sm.full[s], (t / kStages) & 1);
    const unsigned a = sm.a(s) + wg * 64 * BK * 2, b = sm.b(s);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      // A: K-major, 128-byte rows, 8-row groups 1024 bytes apart; k16 steps are 32 bytes in.
      // B: N-major, 64-column boxes 8 KB apart (leading), 8-row groups 1024 bytes apart; a k16
      // step is 16 rows of 128 bytes.
      wgmma_ss<E, BN, 1>(d, smem_desc_sw128(a + kk * 32, 16, 1024),
                             smem_desc_sw128(b + kk * 16 * kBBox * 2, kBBox * BK * 2, 1024));
    }
    wgmma_commit();
    wgmma_wait<1>();  // slice t - 1 is read: free its stage
    if (t > 0 && t_in_wg == 0) mbar_arrive(&sm.empty[(t - 1) % kStages]);
  }
  wgmma_wait<0>();

  const int warp = t_in_wg / 32, lane = t_in_wg % 32;
  const int r = bm + wg * 64 + warp * 16 + lane / 4, c0 = bn + lane % 4 * 2;
  const bool paired = pairs_aligned<Out>(C, n);
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int c = c0 + j * 8;
    if (c >= n) continue;
    if (r < m) kit::store_pair<Out>(C + (long long)r * n + c, d[4 * j], d[4 * j + 1], c + 1 < n, paired);
    if (r + 8 < m) kit::store_pair<Out>(C + (long long)(r + 8) * n + c, d[4 * j + 2], d[4 * j + 3], c + 1 < n, paired);
  }
}

template <class E, class Out>
__device__ void block(const half_bits* A, const half_bits* B, typename Out::T* C, int m, int n, int k, int bm, int bn,
                      unsigned stage0, char* dyn_smem) {
  const unsigned dyn = (kit::smem_addr(dyn_smem) + 1023) & ~1023u;
  char* dyn_aligned = dyn_smem + (dyn - kit::smem_addr(dyn_smem));
  Smem sm{stage0, dyn, reinterpret_cast<unsigned long long*>(dyn_aligned + kBarrierOffset),
          reinterpret_cast<unsigned long long*>(dyn_aligned + kBarrierOffset) + kStages};
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&sm.full[s], 1);
      mbar_init(&sm.empty[s], 2);  // one arrival per consumer warpgroup
    }
    mbar_init_fence();
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x < 32) produce<E>(sm, A, B, m, n, k, bm, bn, dyn + kMapOffset, tensor_map_slots[sm_id()]);
  } else {
    setmaxnreg_inc<232>();
    consume<E, Out>(sm, C, m, n, k, bm, bn, wg - 1);
  }
}

// The copy engine needs 16-byte aligned rows and bases; the slots need a known SM.
__device__ __forceinline__ bool takes_tma(const void* A, const void* B, int n, int k, unsigned stage0) {
  return k > 0 && k % 8 == 0 && n % 8 == 0 && kit::aligned16(A) && kit::aligned16(B) && sm_id() < kTensorMapSlots &&
         (stage0 & 1023) == 0;
}

}  // namespace hopper
#endif

template <class E, class Out>
__device__ __forceinline__ void matmul(const half_bits* A, const half_bits* B, typename Out::T* C, int m, int n, int k) {
  extern __shared__ __align__(1024) char dyn_smem[];
  int tile_m, tile_n;
  block_tile(tile_m, tile_n);
  const int bm = tile_m * BM, bn = tile_n * BN;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(1024) char stage0[hopper::kStageBytes];
  const unsigned s0 = kit::smem_addr(stage0);
  if (hopper::takes_tma(A, B, n, k, s0)) {
    hopper::block<E, Out>(A, B, C, m, n, k, bm, bn, s0, dyn_smem);
    return;
  }
#endif
  ampere::block<E, Out>(A, B, C, m, n, k, bm, bn, dyn_smem);
}

}  // namespace

// Entry points: matmul_<input>[_<result>], f32 results when no result type is named.

extern "C" __global__ void __launch_bounds__(384, 1)
matmul_f16(const half_bits* __restrict__ a, const half_bits* __restrict__ b, float* __restrict__ c, int m, int n, int k) {
  matmul<kit::F16, kit::F32>(a, b, c, m, n, k);
}

extern "C" __global__ void __launch_bounds__(384, 1)
matmul_bf16(const half_bits* __restrict__ a, const half_bits* __restrict__ b, float* __restrict__ c, int m, int n, int k) {
  matmul<kit::BF16, kit::F32>(a, b, c, m, n, k);
}

extern "C" __global__ void __launch_bounds__(384, 1)
matmul_f16_f16(const half_bits* __restrict__ a, const half_bits* __restrict__ b, half_bits* __restrict__ c, int m, int n, int k) {
  matmul<kit::F16, kit::F16>(a, b, c, m, n, k);
}

extern "C" __global__ void __launch_bounds__(384, 1)
matmul_bf16_bf16(const half_bits* __restrict__ a, const half_bits* __restrict__ b, half_bits* __restrict__ c, int m, int n, int k) {
  matmul<kit::BF16, kit::BF16>(a, b, c, m, n, k);
}

extern "C" __global__ void __launch_bounds__(384, 1)
matmul_f16_bf16(const half_bits* __restrict__ a, const half_bits* __restrict__ b, half_bits* __restrict__ c, int m, int n, int k) {
  matmul<kit::F16, kit::BF16>(a, b, c, m, n, k);
}

extern "C" __global__ void __launch_bounds__(384, 1)
matmul_bf16_f16(const half_bits* __restrict__ a, const half_bits* __restrict__ b, half_bits* __restrict__ c, int m, int n, int k) {
  matmul<kit::BF16, kit::F16>(a, b, c, m, n, k);
}
