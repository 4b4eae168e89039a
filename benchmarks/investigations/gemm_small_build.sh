#!/bin/bash
# Compiles what benchmarks/investigations/gemm_small.py compares (run here, nvcc 13, sm_90a cubins):
#   OUT/<variant>/matmul_nt.cubin: the f16 "none" NT entries of every config of configs.py;
#   variants new (this tree), new_trace (with the phase marks), old (kernels/ of REV, e.g. main);
#   OUT/xp.cubin: configs the library does not generate (gemm_small_configs.cu, this tree).
set -e
pids=()
OUT=${1:-.gpu/small}
REV=${2:-main}
mkdir -p "$OUT"
source "$(dirname "$0")/gemm_build_lib.sh"
build() {  # name source-root flags...
  local name=$1 root=$2; shift 2
  local D=""
  for c in $(python3 -c "import sys; sys.path.insert(0, '$root/kernels/matmul'); import configs; print(' '.join('_' + c if c else '@' for c in configs.CONFIGS))"); do
    D="$D -DKITGEMM_ENTRY_matmul_nt_f16_none${c#@}"
  done
  build_matmul_nt "$OUT" "$name" "$root" "$D" "$@"
}
OLD=$(mktemp -d)
git archive "$REV" kernels | tar -x -C "$OLD"
build old "$OLD" & pids+=($!)
build new . & pids+=($!)
build new_trace . -DKITGEMM_TRACE & pids+=($!)
nvcc -arch=sm_90a -cubin -O3 -std=c++17 benchmarks/investigations/gemm_small_configs.cu -o "$OUT/xp.cubin" & pids+=($!)
for pid in "${pids[@]}"; do wait "$pid"; done; pids=()  # each job: a bare wait returns 0 when one failed
rm -rf "$OLD"
ls -la "$OUT"/*
# OUT/check/<source>.cubin: the entries benchmarks/gemm.py --quick checks (epilogues none,
# bias_gelu_tanh, bias_residual, scale; every config, type and layout), with `check` as 3rd argument.
if [ "$3" = check ]; then
  mkdir -p "$OUT/check"
  for src in matmul_nt matmul_nn bmm; do
    D=$(python3 -c "
import sys; sys.path.insert(0, 'kernels/matmul'); import gen_manifest as g
print(' '.join('-D' + g.guard(e) for e in g.entries() if e['src'] == '$src.cu' and e['epi'] in ('none', 'bias_gelu_tanh', 'bias_residual', 'scale')))")
    nvcc -arch=sm_90a -cubin -O3 -std=c++17 -DKITGEMM_DYNAMIC_SMEM=100352 $D kernels/matmul/$src.cu -o "$OUT/check/$src.cubin" & pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done; pids=()  # each job: a bare wait returns 0 when one failed
  ls -la "$OUT/check"
fi
