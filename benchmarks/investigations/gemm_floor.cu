// Floor probes for benchmarks/investigations/gemm_floor.py: kernels launched like the library
// GEMM (384 threads, 100352 bytes of dynamic shared memory plus a static stage, with and without
// a 4-CTA cluster) that do nothing, or only build and publish their two tensor maps.
#include "../../kernels/common/kit_sm90.cuh"

#define FLOOR_BODY                                       \
  extern __shared__ __align__(1024) char dyn[];          \
  __shared__ __align__(1024) char st[24576];             \
  if (never) {                                           \
    st[threadIdx.x] = 1;                                 \
    dyn[threadIdx.x] = st[threadIdx.x ^ 1];              \
  }

extern "C" __global__ void __launch_bounds__(384, 1) floor_plain(int never) { FLOOR_BODY }
extern "C" __global__ void __launch_bounds__(384, 1) __cluster_dims__(1, 1, 4) floor_cluster4(int never) { FLOOR_BODY }

__device__ __align__(128) unsigned char floor_slots[256][2][128];

// The map work of one GEMM CTA: barrier init, two maps built, published and acquired, nothing loaded.
extern "C" __global__ void __launch_bounds__(384, 1) floor_maps(const unsigned short* A, int m, int k, int never) {
  FLOOR_BODY
  using namespace kit::sm90;
  __shared__ __align__(128) unsigned char maps[256];
  __shared__ unsigned long long bar[8];
  if (threadIdx.x == 0) {
    for (int i = 0; i < 8; ++i) mbar_init(&bar[i], 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const unsigned s = kit::smem_addr(maps);
    void* slot = floor_slots[sm_id()];
    if (threadIdx.x == 0) {
      tensor_map_3d<kit::F16>(s, A, k, m, 1, 64, 128);
      tensor_map_3d<kit::F16>(s + 128, A, k, m, 1, 64, 128);
    }
    __syncwarp();
    tensor_map_publish(slot, s);
    tensor_map_publish(static_cast<char*>(slot) + 128, s + 128);
    if (threadIdx.x == 0) {
      tensor_map_acquire(slot);
      tensor_map_acquire(static_cast<char*>(slot) + 128);
    }
  }
}
