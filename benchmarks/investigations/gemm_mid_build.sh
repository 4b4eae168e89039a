#!/bin/bash
# Compiles what benchmarks/investigations/gemm_mid.py compares (run here, nvcc 13, sm_90a cubins):
#   OUT/new/matmul_nt.cubin: the f16 "none" NT entries of every config of configs.py (this tree);
#   OUT/xp_mid.cubin: the multicast configs of gemm_mid_configs.cu.
set -e
OUT=${1:-.gpu/mid}
D=""
for c in $(python3 -c "import sys; sys.path.insert(0, 'kernels/matmul'); import configs; print(' '.join('_' + c if c else '@' for c in configs.CONFIGS))"); do
  D="$D -DKITGEMM_ENTRY_matmul_nt_f16_none${c#@}"
done
mkdir -p "$OUT/new"
nvcc -gencode=arch=compute_90a,code=sm_90a -cubin -O3 -std=c++17 $D kernels/matmul/matmul_nt.cu -o "$OUT/new/matmul_nt.cubin" &
nvcc -gencode=arch=compute_90a,code=sm_90a -cubin -O3 -std=c++17 benchmarks/investigations/gemm_mid_configs.cu -o "$OUT/xp_mid.cubin" &
wait
ls -la "$OUT" "$OUT/new"
# OUT/big/matmul_nt.cubin, OUT/xp_mid_big.cubin: the same with the dynamic shared memory of an
# sm_90-only launch (KITGEMM_DYNAMIC_SMEM, 179 KB: with the 48 KB static stage, the 227 KB an sm_90 block may have), the configs whose stages it fits.
BIG=${KITGEMM_BIG:-183296}
DB=""
for c in @ _t128x128 _t128x128_p; do DB="$DB -DKITGEMM_ENTRY_matmul_nt_f16_none${c#@}"; done
mkdir -p "$OUT/big"
nvcc -gencode=arch=compute_90a,code=sm_90a -cubin -O3 -std=c++17 -DKITGEMM_DYNAMIC_SMEM=$BIG $DB kernels/matmul/matmul_nt.cu -o "$OUT/big/matmul_nt.cubin" &
nvcc -gencode=arch=compute_90a,code=sm_90a -cubin -O3 -std=c++17 -DKITGEMM_DYNAMIC_SMEM=$BIG benchmarks/investigations/gemm_mid_configs.cu -o "$OUT/xp_mid_big.cubin" &
wait
ls -la "$OUT/big" "$OUT"/xp_mid_big.cubin
