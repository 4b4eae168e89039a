// Tensor-core helpers for sm_80 and newer, shared by the matmul and attention kernels
// (included as "../common/kit_mma.cuh").
//
// Header-free, like kit_device.cuh: kitdispatch gives NVRTC no CUDA include directory, so
// <mma.h>, <cuda_fp16.h> and <cuda_bf16.h> are out. Halves travel as raw 16-bit words and the
// tensor cores are driven with PTX: cp.async (global to shared, 16 bytes, zero-filled past the
// edges), ldmatrix (shared to fragments) and mma.sync.m16n8k16.
#pragma once

#include "kit_device.cuh"

namespace kit {

typedef unsigned short half_bits;  // an f16 or bf16 as stored

// Element types of the matrix kernels: what a 16-bit input is, what a result is stored as.
struct F16 {
  typedef half_bits T;
  static constexpr bool kBf16 = false;
};
struct BF16 {
  typedef half_bits T;
  static constexpr bool kBf16 = true;
};
struct F32 {
  typedef float T;
};

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ------------------------------------------------------------------ conversions

// Two floats as one 32-bit word of two halves, `lo` in the low 16 bits.
template <class E>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  unsigned r;
  if constexpr (E::kBf16) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

template <class E>
__device__ __forceinline__ float to_float(half_bits h) {
  if constexpr (E::kBf16) {
    return __uint_as_float(unsigned(h) << 16);
  } else {
    float f;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h));
    return f;
  }
}

// Stores c[0] (and c[1] when `two`) of a result row: one 4- or 8-byte store where the pair is
// aligned (`paired`), element by element otherwise.
template <class Out>
__device__ __forceinline__ void store_pair(typename Out::T* p, float x, float y, bool two, bool paired) {
  if constexpr (sizeof(typename Out::T) == 4) {
    if (two && paired) {
      *reinterpret_cast<float2*>(p) = make_float2(x, y);
    } else {
      p[0] = x;
      if (two) p[1] = y;
    }
  } else {
    const unsigned w = pack2<Out>(x, y);
    if (two && paired) {
      *reinterpret_cast<unsigned*>(p) = w;
    } else {
      p[0] = half_bits(w & 0xffff);
      if (two) p[1] = half_bits(w >> 16);
    }
  }
}

// ------------------------------------------------------------------ async copies

// 16 bytes global -> shared, asynchronous; copies zeros instead when !valid.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Barrier among `threads` threads of the block (a multiple of 32) under `id` (1..15; 0 is
// __syncthreads's).
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The non-blocking half of named_barrier: counts this warp's threads toward barrier `id` and goes
// on (the threads that wait on it use named_barrier with the same `threads`).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ------------------------------------------------------------------ fragments and mma

// Four 8x8 b16 matrices from shared memory; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d += a (16x16, row) * b (16x8, col), f32 accumulators. Accumulator layout: lane l holds rows
// l/4 (d[0], d[1]) and l/4 + 8 (d[2], d[3]), columns 2 * (l % 4) + {0, 1}.
template <class E>
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (E::kBf16) {
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

}  // namespace kit
