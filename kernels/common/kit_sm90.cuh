// Hopper (sm_90a) helpers: mbarriers, the TMA engine's tensor copies with tensor maps built on
// the device, and wgmma. Included as "../common/kit_sm90.cuh"; everything here exists only when
// compiling for sm_90a (`__CUDA_ARCH_FEAT_SM90_ALL`), so a source can include it unconditionally
// and keep its sm_80 path in the same file.
//
// Why tensor maps are built on the device: IREE's dispatch ABI passes only buffer pointers and
// 32-bit push constants, so a `__grid_constant__ CUtensorMap` parameter cannot be passed. A
// block writes its maps into shared memory with `tensormap.replace` (starting from zeros), then
// publishes them to a global slot with `tensormap.cp_fenceproxy` and acquires them for the copy
// engine (PTX ISA 8.3, "tensormap.replace"; CCCL's device tensor-map example does the same from a
// host-made template). The slot is the block's SM (`%smid`): a kernel that uses these slots must
// need more than half an SM's shared memory, so no two of its blocks, or of any other kernel of
// the same module that uses them, are ever on one SM at once.
#pragma once

#include "kit_mma.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

namespace kit {
namespace sm90 {

// ------------------------------------------------------------------ mbarriers

__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
// Makes barrier initialization visible to the copy engine and the other threads.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// One arrival that also announces `bytes` the copy engine will deliver to this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(unsigned long long* bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
// Waits until the phase with parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// Orders this thread's ordinary shared-memory writes before later async-proxy reads (wgmma,
// the copy engine).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ------------------------------------------------------------------ tensor maps

constexpr int kTensorMapBytes = 128;
constexpr int kTensorMapSlots = 256;  // SM ids above this take the kernel's other path

__device__ __forceinline__ unsigned sm_id() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(id));
  return id;
}

// A tiled map of a row-major [outer2, outer1, inner] tensor of 16-bit elements (`inner`
// contiguous, rows of `inner` elements, planes of `outer1` rows), boxes of box_inner x box_outer
// x 1, 128-byte swizzle (box_inner * 2 must be 128), zeros past the edges of every dimension.
// `row_elems`, where given, is the distance between rows (a multiple of 8: rows of a wider
// tensor, e.g. one head of [s, h, d]). Written by one thread into 128 zeroed bytes of shared
// memory at `map`.
template <class E>
__device__ __forceinline__ void tensor_map_3d(unsigned map, const void* base, unsigned inner, unsigned outer1,
                                              unsigned outer2, unsigned box_inner, unsigned box_outer,
                                              unsigned long long row_elems = 0) {
#pragma unroll
  for (int i = 0; i < kTensorMapBytes; i += 16) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(map + i), "r"(0) : "memory");
  }
  const unsigned long long row_bytes = 2ull * (row_elems ? row_elems : inner), plane_bytes = row_bytes * outer1;
  asm volatile(
      "tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;\n"
      "tensormap.replace.tile.rank.shared::cta.b1024.b32 [%0], 2;\n"  // rank - 1
      "tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 0, %2;\n"
      "tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 1, %3;\n"
      "tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 2, %4;\n"
      "tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], 0, %5;\n"
      "tensormap.replace.tile.global_stride.shared::cta.b1024.b64 [%0], 1, %6;\n"
      "tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [%0], 0, %7;\n"
      "tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [%0], 1, %8;\n"
      "tensormap.replace.tile.box_dim.shared::cta.b1024.b32 [%0], 2, 1;\n"
      "tensormap.replace.tile.element_stride.shared::cta.b1024.b32 [%0], 0, 1;\n"
      "tensormap.replace.tile.element_stride.shared::cta.b1024.b32 [%0], 1, 1;\n"
      "tensormap.replace.tile.element_stride.shared::cta.b1024.b32 [%0], 2, 1;\n"
      "tensormap.replace.tile.interleave_layout.shared::cta.b1024.b32 [%0], 0;\n"
      "tensormap.replace.tile.swizzle_mode.shared::cta.b1024.b32 [%0], 3;\n"  // 128 bytes
      "tensormap.replace.tile.fill_mode.shared::cta.b1024.b32 [%0], 0;\n"     // zeros
      ::"r"(map),
      "l"(base), "r"(inner), "r"(outer1), "r"(outer2), "l"(row_bytes), "l"(plane_bytes), "r"(box_inner),
      "r"(box_outer)
      : "memory");
  if constexpr (E::kBf16) {  // element type codes: PTX ISA, tensormap.replace's new_val table
    asm volatile("tensormap.replace.tile.elemtype.shared::cta.b1024.b32 [%0], 10;\n" ::"r"(map) : "memory");
  } else {
    asm volatile("tensormap.replace.tile.elemtype.shared::cta.b1024.b32 [%0], 6;\n" ::"r"(map) : "memory");
  }
}

// A matrix [outer, inner] as a 3-D map of one plane: coordinates (inner, outer, 0).
template <class E>
__device__ __forceinline__ void tensor_map_2d(unsigned map, const void* base, unsigned inner, unsigned outer,
                                              unsigned box_inner, unsigned box_outer) {
  tensor_map_3d<E>(map, base, inner, outer, 1, box_inner, box_outer);
}

// Copies a map from shared memory to its global slot and releases it to the copy engine.
// Warp-collective: every lane of the warp executes it with the same operands.
__device__ __forceinline__ void tensor_map_publish(void* slot, unsigned map) {
  asm volatile(
      "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [%0], [%1], 128;\n" ::"l"(
          slot),
      "r"(map)
      : "memory");
}
// Before this thread's first copy with a map that was (re)written.
__device__ __forceinline__ void tensor_map_acquire(const void* slot) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(slot) : "memory");
}

// Box (c0 inner, c1, c2 outer) of a map -> shared memory at `dst`; completes on `bar`.
__device__ __forceinline__ void tma_load_3d(unsigned dst, const void* map, int c0, int c1, int c2,
                                            unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}

// ------------------------------------------------------------------ wgmma

// Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address,
// leading- and stride-dimension byte offsets (all >> 4), 128-byte swizzle.
__device__ __forceinline__ unsigned long long smem_desc_sw128(unsigned addr, unsigned lbo, unsigned sbo) {
  return (unsigned long long)((addr & 0x3ffff) >> 4) | (unsigned long long)((lbo & 0x3ffff) >> 4) << 16 |
         (unsigned long long)((sbo & 0x3ffff) >> 4) << 32 | 1ull << 62;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

#define KIT_D8(i)                                                                                           \
  "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define KIT_D32(i) KIT_D8(i), KIT_D8(i + 8), KIT_D8(i + 16), KIT_D8(i + 24)
#define KIT_D64(i) KIT_D32(i), KIT_D32(i + 32)
#define KIT_D48 KIT_D32(0), KIT_D8(32), KIT_D8(40)
#define KIT_D96 KIT_D64(0), KIT_D32(64)
#define KIT_D128 KIT_D64(0), KIT_D64(64)
#define KIT_WGMMA_REGS_32 \
  "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define KIT_WGMMA_REGS_64 \
  "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, " \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
  "%62, %63}"
#define KIT_WGMMA_REGS_48 \
  "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, " \
  "%44, %45, %46, %47}"
#define KIT_WGMMA_REGS_96 \
  "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, " \
  "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, " \
  "%66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, " \
  "%88, %89, %90, %91, %92, %93, %94, %95}"
#define KIT_WGMMA_REGS_128 \
  "{" \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, " \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
  "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
  "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, " \
  "%101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, " \
  "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

// The accumulator operands come first (%0 ..), then the A and B operands, `accumulate` and the
// B transpose flag; `acc`, `tb` and the operand names below are their numbers.
#define KIT_WGMMA_SS(shape, type, regs, da, db, acc, tb, ops)                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " acc ", 0;\nwgmma.mma_async.sync.aligned." shape ".f32." type \
               "." type " " regs ", " da ", " db ", p, 1, 1, 0, " tb ";\n}\n"                                     \
               : ops                                                                                              \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransB))
#define KIT_WGMMA_RS(shape, type, regs, a0, a1, a2, a3, db, acc, tb, ops)                                        \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " acc ", 0;\nwgmma.mma_async.sync.aligned." shape ".f32." type \
               "." type " " regs ", {" a0 ", " a1 ", " a2 ", " a3 "}, " db ", p, 1, 1, " tb ";\n}\n"             \
               : ops                                                                                              \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(kTransB))

// d (64 x N, f32) = A (64 x 16) * B (16 x N) + (accumulate ? d : 0), issued by a whole
// warpgroup; A K-major in shared memory, B in shared memory, K-major (kTransB = 0) or N-major
// (kTransB = 1). Accumulator layout: thread t of the warpgroup holds, for j = 0 .. N/8 - 1, rows
// 16 * (t / 32) + (t % 32) / 4 (+ 8) and columns 8 * j + 2 * (t % 4) (+ 1), in d[4j .. 4j+3]
// ordered (row, col), (row, col + 1), (row + 8, col), (row + 8, col + 1).
template <class E, int N, int kTransB>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], unsigned long long desc_a, unsigned long long desc_b,
                                         int accumulate = 1) {
  static_assert(N == 64 || N == 96 || N == 128 || N == 192 || N == 256, "shapes with code here");
  if constexpr (N == 96 && E::kBf16) {
    KIT_WGMMA_SS("m64n96k16", "bf16", KIT_WGMMA_REGS_48, "%48", "%49", "%50", "%51", KIT_D48);
  } else if constexpr (N == 96) {
    KIT_WGMMA_SS("m64n96k16", "f16", KIT_WGMMA_REGS_48, "%48", "%49", "%50", "%51", KIT_D48);
  } else if constexpr (N == 64 && E::kBf16) {
    KIT_WGMMA_SS("m64n64k16", "bf16", KIT_WGMMA_REGS_32, "%32", "%33", "%34", "%35", KIT_D32(0));
  } else if constexpr (N == 64) {
    KIT_WGMMA_SS("m64n64k16", "f16", KIT_WGMMA_REGS_32, "%32", "%33", "%34", "%35", KIT_D32(0));
  } else if constexpr (N == 128 && E::kBf16) {
    KIT_WGMMA_SS("m64n128k16", "bf16", KIT_WGMMA_REGS_64, "%64", "%65", "%66", "%67", KIT_D64(0));
  } else if constexpr (N == 128) {
    KIT_WGMMA_SS("m64n128k16", "f16", KIT_WGMMA_REGS_64, "%64", "%65", "%66", "%67", KIT_D64(0));
  } else if constexpr (N == 192 && E::kBf16) {
    KIT_WGMMA_SS("m64n192k16", "bf16", KIT_WGMMA_REGS_96, "%96", "%97", "%98", "%99", KIT_D96);
  } else if constexpr (N == 192) {
    KIT_WGMMA_SS("m64n192k16", "f16", KIT_WGMMA_REGS_96, "%96", "%97", "%98", "%99", KIT_D96);
  } else if constexpr (E::kBf16) {
    KIT_WGMMA_SS("m64n256k16", "bf16", KIT_WGMMA_REGS_128, "%128", "%129", "%130", "%131", KIT_D128);
  } else {
    KIT_WGMMA_SS("m64n256k16", "f16", KIT_WGMMA_REGS_128, "%128", "%129", "%130", "%131", KIT_D128);
  }
}

// The same with A (64 x 16) from registers: per warp, the A fragment of mma.sync.m16n8k16
// for its 16 rows (a[0]: row r, k 2c..2c+1; a[1]: row r + 8; a[2], a[3]: k + 8; r = lane / 4,
// c = lane % 4), which is how the accumulators of a previous wgmma lie, packed to 16 bits.
template <class E, int N, int kTransB>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const unsigned (&a)[4], unsigned long long desc_b,
                                         int accumulate = 1) {
  static_assert(N == 64 || N == 128, "shapes with code here");
  if constexpr (N == 64 && E::kBf16) {
    KIT_WGMMA_RS("m64n64k16", "bf16", KIT_WGMMA_REGS_32, "%32", "%33", "%34", "%35", "%36", "%37", "%38", KIT_D32(0));
  } else if constexpr (N == 64) {
    KIT_WGMMA_RS("m64n64k16", "f16", KIT_WGMMA_REGS_32, "%32", "%33", "%34", "%35", "%36", "%37", "%38", KIT_D32(0));
  } else if constexpr (E::kBf16) {
    KIT_WGMMA_RS("m64n128k16", "bf16", KIT_WGMMA_REGS_64, "%64", "%65", "%66", "%67", "%68", "%69", "%70", KIT_D64(0));
  } else {
    KIT_WGMMA_RS("m64n128k16", "f16", KIT_WGMMA_REGS_64, "%64", "%65", "%66", "%67", "%68", "%69", "%70", KIT_D64(0));
  }
}

}  // namespace sm90
}  // namespace kit

#endif  // __CUDA_ARCH_FEAT_SM90_ALL
