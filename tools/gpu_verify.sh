#!/usr/bin/env bash
# The GPU verification run, on a GPU machine that has IREE's runtime but no iree-compile:
# every prebuilt module against its numpy reference, the GPU tests, and the per-call benchmark.
#
#   python tools/prebuild.py .gpu/prebuilt                     # on the build machine
#   bash tools/gpu_verify.sh .gpu/prebuilt OUT [PYTEST ARGS]   # on the GPU machine
#
# Writes OUT/env.txt, OUT/verify.txt (kitdispatch test), OUT/pytest-gpu.txt and OUT/calls.txt;
# exits non-zero when any of them failed.
set -uo pipefail
prebuilt=${1:?usage: gpu_verify.sh PREBUILT OUT [PYTEST ARGS]}
out=${2:?usage: gpu_verify.sh PREBUILT OUT [PYTEST ARGS]}
shift 2
mkdir -p "$out"
export PYTHONUNBUFFERED=1
status=0

{
  date -u
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 - <<'EOF'
import sys, importlib.metadata as m
print("python", sys.version.split()[0])
for n in ("iree-base-runtime", "torch", "numpy", "cuda-bindings"):
    try:
        print(n, m.version(n))
    except m.PackageNotFoundError:
        print(n, "not installed")
EOF
} 2>&1 | tee "$out/env.txt"

# Module builds only: the model builds (NAME_model) are compared by tests/models/test_compare.py.
modules=$(for d in "$prebuilt"/*; do [ -e "$d"/*.model.json ] || echo "$d"; done)
python3 -m kitdispatch test $modules 2>&1 | tee "$out/verify.txt" || status=1
KITDISPATCH_PREBUILT="$prebuilt" timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu "$@" 2>&1 \
  | tee "$out/pytest-gpu.txt" | tail -40 || status=1
if [ -d "$prebuilt/elementwise" ]; then
  timeout 240 python3 benchmarks/calls.py "$prebuilt/elementwise" "$out/calls" 2>&1 | tee "$out/calls.txt" | tail -60 || status=1
fi
exit $status
