// Kernels whose `out` pointers come before their inputs, with results of one shape: each
// result must land in a buffer of its own (issue 21: mean and rstd came back as one).

// llm.c's layernorm_forward_kernel3 signature, one thread per row, in double so that the
// f32 results are the numpy reference's to the last bit or so.
extern "C" __global__ void layernorm_forward_kernel3(float* out, float* mean, float* rstd, const float* inp,
                                                     const float* weight, const float* bias, int N, int C) {
  int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= N) return;
  const float* x = inp + row * C;
  double m = 0.0;
  for (int c = 0; c < C; ++c) m += x[c];
  m /= C;
  double v = 0.0;
  for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
  double s = 1.0 / sqrt(v / C + 1e-5);
  for (int c = 0; c < C; ++c) out[row * C + c] = (float)((x[c] - m) * s * weight[c] + bias[c]);
  mean[row] = (float)m;
  rstd[row] = (float)s;
}

// Static shapes, three same-shape results before the input.
extern "C" __global__ void three_of_one(float* plus, float* times, float* minus, const float* x) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 64) return;
  plus[i] = x[i] + 1.0f;
  times[i] = x[i] * 2.0f;
  minus[i] = x[i] - 3.0f;
}
