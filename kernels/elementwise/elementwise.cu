// Element-wise kernels. Flat f32 arrays of n elements; every thread handles 4 consecutive
// elements with one 16-byte load per input and one 16-byte store (kit::map4), so a block of 256
// threads covers 1024 elements: workgroup_count = ceildiv(n, 1024).
#include "../common/kit_device.cuh"

constexpr int kThreads = 256;

// GELU, tanh form (PyTorch's approximate="tanh"): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
// written as x / (1 + exp(-2u)), the same value without the cancellation of 1 + tanh(u) near -1.
__device__ __forceinline__ float gelu_tanh(float x) {
  const float two_u = 1.5957691216057308f * (x + 0.044715f * x * x * x);
  return x / (1.0f + expf(-two_u));
}

// out = x + y
extern "C" __global__ void __launch_bounds__(kThreads)
add(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out, int n) {
  kit::map4(out, n, [](float a, float b) { return a + b; }, x, y);
}

// out = max(x, 0); NaN stays NaN, as with numpy.maximum
extern "C" __global__ void __launch_bounds__(kThreads)
relu(const float* __restrict__ x, float* __restrict__ out, int n) {
  kit::map4(out, n, [](float a) { return a < 0.0f ? 0.0f : a; }, x);
}

// out = gelu(x)
extern "C" __global__ void __launch_bounds__(kThreads)
gelu(const float* __restrict__ x, float* __restrict__ out, int n) {
  kit::map4(out, n, [](float a) { return gelu_tanh(a); }, x);
}

// Fused: out = alpha * x + y (one pass instead of a scale and an add)
extern "C" __global__ void __launch_bounds__(kThreads)
scale_add(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out, float alpha, int n) {
  kit::map4(out, n, [alpha](float a, float b) { return alpha * a + b; }, x, y);
}

// Fused: out[r, c] = gelu(x[r, c] + bias[c]) on a row-major [rows, cols] tensor.
//
// The manifest cannot size a grid by rows * cols (a product of two dimensions is not affine), so
// the blocks walk the flat tensor grid-stride, 1024 elements (a float4 per thread) at a time:
// full vector width whatever the row length, and any grid size is correct.
extern "C" __global__ void __launch_bounds__(kThreads)
bias_gelu(const float* __restrict__ x, const float* __restrict__ bias, float* __restrict__ out, int rows, int cols) {
  const long long total = (long long)rows * cols;
  const long long stride = 4LL * gridDim.x * blockDim.x;
  const bool aligned = kit::all_aligned16(x, out);
  for (long long i = kit::chunk_start(blockIdx.x); i < total; i += stride) {
    int c = total <= 0x7fffffff ? int(i) % cols : int(i % cols);  // one division per 4 elements
    const bool vec = aligned && i + 4 <= total;
    float v[4];
    if (vec) {
      const float4 q = kit::load4(x + i);
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
      for (int j = 0; j < 4; ++j) v[j] = i + j < total ? x[i + j] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // c walks the 4 columns, wrapping into the next row
      v[j] = gelu_tanh(v[j] + bias[c]);
      c = c + 1 == cols ? 0 : c + 1;
    }
    if (vec) {
      kit::store4(out + i, make_float4(v[0], v[1], v[2], v[3]));
    } else {
      for (int j = 0; j < 4 && i + j < total; ++j) out[i + j] = v[j];
    }
  }
}
