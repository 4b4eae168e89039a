// llm.c's layernorm_forward_kernel6 in f32: weight, bias and each warp's row live in
// dynamic shared memory, (2 + blockDim.y) * C floats, as its host code computes them.
#include "warp_reduce.h"
#ifndef LN_EPS
#error "LN_EPS comes from the manifest's defines"
#endif

extern "C" __global__ void layernorm_forward(float* __restrict__ out, float* __restrict__ mean,
                                             float* __restrict__ rstd, const float* __restrict__ inp,
                                             const float* __restrict__ weight,
                                             const float* __restrict__ bias, int N, int C) {
  extern __shared__ float params[];
  float* s_weight = params;
  float* s_bias = params + C;
  float* s_in = params + (2 + threadIdx.y) * C;
  int tid = threadIdx.y * blockDim.x + threadIdx.x;
  for (int i = tid; i < C; i += blockDim.x * blockDim.y) {
    s_weight[i] = weight[i];
    s_bias[i] = bias[i];
  }
  __syncthreads();
  int idx = blockIdx.x * blockDim.y + threadIdx.y;
  if (idx >= N) return;
  const float* x = inp + (size_t)idx * C;
  float sum = 0.0f;
  for (int c = threadIdx.x; c < C; c += 32) {
    s_in[c] = x[c];
    sum += x[c];
  }
  float m = warp_sum(sum) / C;
  float var = 0.0f;
  for (int c = threadIdx.x; c < C; c += 32) {
    float d = s_in[c] - m;
    var += d * d;
  }
  float s = rsqrtf(warp_sum(var) / C + LN_EPS);
  float* o = out + (size_t)idx * C;
  for (int c = threadIdx.x; c < C; c += 32) o[c] = (s_in[c] - m) * s * s_weight[c] + s_bias[c];
  if (threadIdx.x == 0) {
    mean[idx] = m;
    rstd[idx] = s;
  }
}
