// Found only through include_dirs = ["include"]: nothing beside the sources has it.
#pragma once
__device__ inline float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
