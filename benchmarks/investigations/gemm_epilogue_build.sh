#!/bin/bash
# Compiles what benchmarks/investigations/gemm_epilogue.py compares (run here, nvcc 13, sm_90a):
#   OUT/{old,new,newpp}/matmul_nt.cubin: the f16 NT entries of its epilogues and configs, from
#   kernels/ of REV (old, e.g. main), this tree (new), this tree with -DKITGEMM_PERSISTENT_PINGPONG=1;
#   OUT/math.cubin: gemm_epilogue_math.cu.
set -e
pids=()
OUT=${1:-.gpu/epi}
REV=${2:-main}
mkdir -p "$OUT"
D=$(python3 -c "
import sys; sys.path.insert(0, 'benchmarks/investigations'); sys.path.insert(0, 'kernels/matmul')
import ast, gen_manifest as g
src = open('benchmarks/investigations/gemm_epilogue.py').read()
tree = ast.parse(src)
vals = {t.targets[0].id: ast.literal_eval(t.value) for t in tree.body if isinstance(t, ast.Assign) and t.targets[0].id in ('EPIS', 'SHAPES')}
cfgs = sorted({c for _, cs in vals['SHAPES'] for c in cs})
print(' '.join('-DKITGEMM_ENTRY_' + g.kernel_name('matmul', 'nt', 'f16', 'f16', e, c) for e in vals['EPIS'] for c in cfgs))")
source "$(dirname "$0")/gemm_build_lib.sh"
build() {  # name source-root flags...
  local name=$1 root=$2; shift 2
  build_matmul_nt "$OUT" "$name" "$root" "$D" "$@"
}
OLD=$(mktemp -d)
git archive "$REV" kernels | tar -x -C "$OLD"
build old "$OLD" & pids+=($!)
build new . & pids+=($!)
build newpp . -DKITGEMM_PERSISTENT_PINGPONG=1 & pids+=($!)
nvcc -arch=sm_90a -cubin -O3 -std=c++17 benchmarks/investigations/gemm_epilogue_math.cu -o "$OUT/math.cubin" & pids+=($!)
for pid in "${pids[@]}"; do wait "$pid"; done; pids=()  # each job: a bare wait returns 0 when one failed
rm -rf "$OLD"
ls -la "$OUT"/*
