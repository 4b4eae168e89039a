// Multicast configs for benchmarks/investigations/gemm_mid.py (issue 25, round 32): f16 "none"
// entries of gemm.cuh whose MC CTAs of a cluster along M share the B tile through TMA multicast.
// Grid (ceildiv(n, BN), MC * ceildiv(m, 128 * MC), 1).
#include "../../kernels/matmul/gemm.cuh"

#define XPM(NAME, NT, BN, MC)                                                                               \
  extern "C" __global__ void __launch_bounds__(384, 1) KIT_MULTICAST_M(MC)                                  \
      NAME(const unsigned short* __restrict__ a, const unsigned short* __restrict__ w,                      \
           unsigned short* __restrict__ c, int m, int n, int k) {                                           \
    kitgemm::gemm<kit::F16, kit::F16, NT, BN, 1, kitgemm::kNone, 1, 128, MC>(                               \
        a, w, c, kitgemm::EpiArgs<kit::F16>{nullptr, nullptr, 0.0f}, 1, m, n, k);                           \
  }

XPM(xp_t128x256_m2, true, 256, 2)
XPM(xp_t128x128_m2, true, 128, 2)
XPM(xp_nn_t128x256_m2, false, 256, 2)
XPM(xp_nn_t128x128_m2, false, 128, 2)

// The persistent 128 x 128 kernel with ping-pong consumers (gemm.cuh, pingpong_consume), against
// t128x128_p's cooperative ones. Grid (132, 1, 1).
#define XPP(NAME, NT, PP)                                                                                   \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                      \
      NAME(const unsigned short* __restrict__ a, const unsigned short* __restrict__ w,                      \
           unsigned short* __restrict__ c, int m, int n, int k) {                                           \
    kitgemm::gemm_persistent<kit::F16, kit::F16, NT, 128, kitgemm::kNone, PP>(                              \
        a, w, c, kitgemm::EpiArgs<kit::F16>{nullptr, nullptr, 0.0f}, 1, m, n, k);                           \
  }

XPP(xp_t128x128_pp, true, true)
XPP(xp_nn_t128x128_pp, false, true)
XPP(xp_t128x128_pc, true, false)
