// Split-K configs that the library does not generate, for benchmarks/investigations/gemm_floor.py:
// f16 NT "none" entries of gemm.cuh with other (BN, S). Grid (ceildiv(n, BN), ceildiv(m, 128), S).
#include "../../kernels/matmul/gemm.cuh"

#define XP(BN, S)                                                                                           \
  extern "C" __global__ void __launch_bounds__(384, 1) KIT_SPLIT_K(S)                                       \
      xp_t128x##BN##_k##S(const unsigned short* __restrict__ a, const unsigned short* __restrict__ w,       \
                          unsigned short* __restrict__ c, int m, int n, int k) {                            \
    kitgemm::gemm<kit::F16, kit::F16, true, BN, S, kitgemm::kNone, 1>(                                      \
        a, w, c, kitgemm::EpiArgs<kit::F16>{nullptr, nullptr, 0.0f}, 1, m, n, k);                           \
  }

XP(128, 4)
XP(128, 8)
XP(64, 2)
XP(64, 8)
XP(256, 2)
