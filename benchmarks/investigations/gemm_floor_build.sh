#!/bin/bash
# Compiles what benchmarks/investigations/gemm_floor.py compares (run here, nvcc 13):
#   OUT/<variant>/matmul_nt.cubin with the f16 "none" NT entries of every config, OUT/floor.cubin.
# Variants: new (this tree), new_trace (with the phase marks), old (kernels/ of REV, e.g. main).
set -e
OUT=${1:-.gpu/floor}
REV=${2:-main}
mkdir -p "$OUT"
D=""
for c in "" _t128x128 _t128x128_k2 _t128x64_k4 _t128x128_p; do D="$D -DKITGEMM_ENTRY_matmul_nt_f16_none$c"; done
build() {  # name arch source-root flags...
  local name=$1 arch=$2 root=$3; shift 3
  mkdir -p "$OUT/$name"
  nvcc -arch=$arch -cubin -O3 -std=c++17 -DKITGEMM_DYNAMIC_SMEM=100352 $D "$@" "$root/kernels/matmul/matmul_nt.cu" -o "$OUT/$name/matmul_nt.cubin"
}
OLD=$(mktemp -d)
git archive "$REV" kernels | tar -x -C "$OLD"
build old sm_90a "$OLD"
build new sm_90a .
build new_trace sm_90a . -DKITGEMM_TRACE
rm -rf "$OLD"
nvcc -arch=sm_90a -cubin -O3 -std=c++17 benchmarks/investigations/gemm_floor.cu -o "$OUT/floor.cubin"

nvcc -arch=sm_90a -cubin -O3 -std=c++17 benchmarks/investigations/gemm_floor_configs.cu -o "$OUT/xp.cubin"
ls -la "$OUT"/*
