// The epilogues' activations over a vector of f32 inputs, for benchmarks/investigations/gemm_epilogue.py:
// which 0-2 gemm.cuh's epilogues (gelu_erf, gelu_tanh with c, bias_silu with bias 0), 3-5 the forms
// of the tree before round 38 (erff, tanhf, expf with IEEE division).
#include "../../kernels/matmul/gemm.cuh"

extern "C" __global__ void activations(const float* __restrict__ x, float* __restrict__ y, int n, int which, float c) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = x[i];
  float r;
  switch (which) {
    case 0: r = kitgemm::epilogue_of<kitgemm::kGeluErf>(v, 0.0f, 0.0f, c); break;
    case 1: r = kitgemm::epilogue_of<kitgemm::kGeluTanh>(v, 0.0f, 0.0f, c); break;
    case 2: r = kitgemm::epilogue_of<kitgemm::kBiasSilu>(v, 0.0f, 0.0f, c); break;
    case 3: r = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); break;
    case 4: r = 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v))); break;
    default: r = v / (1.0f + expf(-v)); break;
  }
  y[i] = r;
}
