// Reports the dynamic shared memory its launch got (PTX's %dynamic_smem_size) in every element,
// after writing and reading back the last byte of that memory.
extern "C" __global__ void reserved_shared(unsigned* __restrict__ out, int n) {
  extern __shared__ unsigned char pool[];
  unsigned size;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(size));
  if (threadIdx.x == 0 && size > 0) pool[size - 1] = 1;
  __syncthreads();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = size > 0 && pool[size - 1] == 1 ? size : 0u;
}
