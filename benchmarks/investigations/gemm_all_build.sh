#!/bin/bash
# Every generated entry of kernels/matmul (gen_manifest.py), one sm_90a cubin per source, for
# benchmarks/gemm.py's check and timing on the GPU machine (nvcc 13 here, about 5 min on 2 cores).
set -e
pids=()
OUT=${1:-.gpu/all}
mkdir -p "$OUT"
for src in matmul_nt matmul_nn bmm matmul_f32; do
  D=$(grep -o "KITGEMM_ENTRY_[A-Za-z0-9_]*" kernels/matmul/$src.cu | sort -u | sed 's/^/-D/' | tr '\n' ' ')
  nvcc -arch=sm_90a -cubin -O3 -std=c++17 $D kernels/matmul/$src.cu -o "$OUT/$src.cubin" & pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done; pids=()  # each job: a bare wait returns 0 when one failed
ls -la "$OUT"
