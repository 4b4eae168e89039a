#!/bin/bash
# Stages what one GPU run of gemm_small.py / gemm.py needs into DIR (run here, from the repo root):
# the scripts with this tree's configs.py and gen_manifest.py (the GPU machine gets another tree).
set -e
DIR=$1
mkdir -p "$DIR/benchmarks/investigations" "$DIR/kernels/matmul"
cp benchmarks/gemm.py benchmarks/gemm_shapes.py "$DIR/benchmarks/"
cp benchmarks/investigations/gemm_small.py benchmarks/investigations/gemm_floor.py "$DIR/benchmarks/investigations/"
cp kernels/matmul/gen_manifest.py kernels/matmul/configs.py "$DIR/kernels/matmul/"
