// Split-K configs the library does not generate, for benchmarks/investigations/gemm_small.py:
// f16 NT "none" entries of gemm.cuh with other (TM, BN, S). Grid (ceildiv(n, BN), ceildiv(m, TM), S).
#include "../../kernels/matmul/gemm.cuh"

// XP_PREFIX: the kernels' name prefix (xp_t64x64_k2 ...), another for builds with other flags
#ifndef XP_PREFIX
#define XP_PREFIX xp
#endif
#define XP_CAT(P, TM, BN, S) P##_t##TM##x##BN##_k##S
#define XP_NAME(P, TM, BN, S) XP_CAT(P, TM, BN, S)
#define XP(TM, BN, S)                                                                                       \
  extern "C" __global__ void __launch_bounds__(384, 1) KIT_SPLIT_K(S)                                       \
      XP_NAME(XP_PREFIX, TM, BN, S)(const unsigned short* __restrict__ a, const unsigned short* __restrict__ w,    \
                             unsigned short* __restrict__ c, int m, int n, int k) {                         \
    kitgemm::gemm<kit::F16, kit::F16, true, BN, S, kitgemm::kNone, 1, TM>(                                  \
        a, w, c, kitgemm::EpiArgs<kit::F16>{nullptr, nullptr, 0.0f}, 1, m, n, k);                           \
  }

XP(128, 128, 4)
XP(128, 64, 8)
XP(128, 256, 2)
XP(64, 64, 2)
XP(64, 128, 1)
XP(64, 128, 2)
XP(64, 192, 1)
XP(128, 192, 1)
XP(128, 96, 1)
