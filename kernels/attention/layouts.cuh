// Where a head of Q, K, V or O lies in memory, for attention.cu (f16, bf16) and attention_f32.cu.
#pragma once

namespace kit_attention {

// [b, h, s, d] (rows of one head contiguous), [b, s, h, d] (a projection's output before the
// transpose to heads: rows h * d apart), or, for K only, [b, h, d, s] (K^T, as a transposing
// projection leaves it), or one third of a packed QKV projection [b, s, 3, h, d] (rows 3 * h * d
// apart; the caller offsets K by h * d, V by 2 * h * d).
enum Order { BHSD, BSHD, BHDS, BS3HD };

// Head `head` of `heads` of a tensor of layout L in this block's batch (blockIdx.z): its first
// element, and the distance between its rows.
template <Order L>
__device__ __forceinline__ long long head_offset(int heads, int head, int s, int d) {
  return L == BSHD    ? ((long long)blockIdx.z * s * heads + head) * d
         : L == BS3HD ? ((long long)blockIdx.z * s * 3 * heads + head) * d
                      : ((long long)blockIdx.z * heads + head) * s * d;
}

template <Order L>
__device__ __forceinline__ long long row_stride(int heads, int s, int d) {
  return L == BSHD ? (long long)heads * d : L == BS3HD ? 3LL * heads * d : L == BHDS ? s : d;
}

}  // namespace kit_attention
