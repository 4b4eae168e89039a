#!/bin/bash
# Compiles what benchmarks/investigations/gemm_mid.py compares (run here, nvcc 13, sm_90a cubins):
#   OUT/new/matmul_nt.cubin: the f16 "none" NT entries of every config of configs.py (this tree);
#   OUT/new/bmm.cubin: the f16 "none" bmm_nt / bmm_nn entries of the persistent config;
#   OUT/big/matmul_nt.cubin: the configs whose rings 179 KB of dynamic shared memory deepens,
#   built for it (KITGEMM_DYNAMIC_SMEM; with the 48 KB static stage, the 227 KB an sm_90 block may have).
set -e
pids=()
OUT=${1:-.gpu/mid}
BIG=${KITGEMM_BIG:-183296}
NVCC="nvcc -gencode=arch=compute_90a,code=sm_90a -cubin -O3 -std=c++17"
D=""
for c in $(python3 -c "import sys; sys.path.insert(0, 'kernels/matmul'); import configs; print(' '.join('_' + c if c else '@' for c in configs.CONFIGS))"); do
  D="$D -DKITGEMM_ENTRY_matmul_nt_f16_none${c#@}"
done
DB=""
for c in @ _t128x128 _t128x128_p; do DB="$DB -DKITGEMM_ENTRY_matmul_nt_f16_none${c#@}"; done
mkdir -p "$OUT/new" "$OUT/big"
# new: as measured in round 32, at 100352 bytes (sm_90a builds of gemm.cuh take 183296 since round 35)
$NVCC -DKITGEMM_DYNAMIC_SMEM=100352 $D kernels/matmul/matmul_nt.cu -o "$OUT/new/matmul_nt.cubin" & pids+=($!)
$NVCC -DKITGEMM_DYNAMIC_SMEM=100352 -DKITGEMM_ENTRY_bmm_nt_f16_none_t128x128_p -DKITGEMM_ENTRY_bmm_nn_f16_none_t128x128_p kernels/matmul/bmm.cu -o "$OUT/new/bmm.cubin" & pids+=($!)
$NVCC -DKITGEMM_DYNAMIC_SMEM=$BIG $DB kernels/matmul/matmul_nt.cu -o "$OUT/big/matmul_nt.cubin" & pids+=($!)
for pid in "${pids[@]}"; do wait "$pid"; done; pids=()  # each job: a bare wait returns 0 when one failed
ls -la "$OUT/new" "$OUT/big"
# OUT/epi/{lib,coop}/matmul_nt.cubin (with `epilogues` as 2nd argument): every epilogue's f16 NT
# entry of t128x256, t128x128 and t128x128_p, as generated (lib) and with cooperative persistent consumers (coop).
if [ "$2" = epilogues ]; then
  DE=$(python3 -c "
import sys; sys.path.insert(0, 'kernels/matmul'); import gen_manifest as g
print(' '.join('-DKITGEMM_ENTRY_' + g.kernel_name('matmul', 'nt', 'f16', 'f16', ep, c) for ep in g.EPILOGUES + g.MODEL_EPILOGUES for c in ('', 't128x128', 't128x128_p')))")
  mkdir -p "$OUT/epi/lib" "$OUT/epi/coop"
  $NVCC -DKITGEMM_DYNAMIC_SMEM=100352 $DE kernels/matmul/matmul_nt.cu -o "$OUT/epi/lib/matmul_nt.cubin" & pids+=($!)
  $NVCC -DKITGEMM_DYNAMIC_SMEM=100352 -DKITGEMM_PERSISTENT_COOPERATIVE=1 $DE kernels/matmul/matmul_nt.cu -o "$OUT/epi/coop/matmul_nt.cubin" & pids+=($!)
  for pid in "${pids[@]}"; do wait "$pid"; done; pids=()  # each job: a bare wait returns 0 when one failed
  ls -la "$OUT/epi/lib" "$OUT/epi/coop"
fi
