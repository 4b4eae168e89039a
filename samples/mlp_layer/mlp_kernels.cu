// The custom half of an MLP layer: the activation and the softmax that follow the matmul IREE
// generates (see mlp.mlir). Self-contained teaching versions: one element per thread, plain
// loads; kernels/ holds the vectorized library versions of both.

// GELU, tanh form: x / (1 + exp(-2u)) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
__device__ float gelu_tanh(float x) {
  return x / (1.0f + expf(-1.5957691216057308f * (x + 0.044715f * x * x * x)));
}

// out[r, c] = gelu(h[r, c] + bias[c]). Grid: x = rows, y = column blocks of 256.
extern "C" __global__ void __launch_bounds__(256)
bias_gelu(const float* __restrict__ h, const float* __restrict__ bias, float* __restrict__ out, int cols) {
  const int c = blockIdx.y * 256 + threadIdx.x;
  const long long i = (long long)blockIdx.x * cols + c;
  if (c < cols) out[i] = gelu_tanh(h[i] + bias[c]);
}

// The block's combination of one value per thread (256 threads = 8 warps), `max` or sum.
template <bool kMax>
__device__ float block_reduce(float v) {
  __shared__ float warp_part[8];
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  if (threadIdx.x % 32 == 0) warp_part[threadIdx.x / 32] = v;
  __syncthreads();
  v = warp_part[0];
  for (int w = 1; w < 8; ++w) v = kMax ? fmaxf(v, warp_part[w]) : v + warp_part[w];
  __syncthreads();  // warp_part is reused by the next call
  return v;
}

// out[r, :] = softmax(x[r, :]), max-subtracted. One block of 256 threads per row, three passes.
extern "C" __global__ void __launch_bounds__(256)
row_softmax(const float* __restrict__ x, float* __restrict__ out, int cols) {
  const float* row = x + (long long)blockIdx.x * cols;
  float* dst = out + (long long)blockIdx.x * cols;
  float m = __int_as_float(0xff800000);  // -inf
  for (int c = threadIdx.x; c < cols; c += 256) m = fmaxf(m, row[c]);
  m = block_reduce<true>(m);
  float s = 0.0f;
  for (int c = threadIdx.x; c < cols; c += 256) s += expf(row[c] - m);
  const float inv = 1.0f / block_reduce<false>(s);
  for (int c = threadIdx.x; c < cols; c += 256) dst[c] = expf(row[c] - m) * inv;
}
