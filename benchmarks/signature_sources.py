"""Where a kernel's signature should come from: the kit's parser, libclang, or the compiler.

For every `__global__` function of every .cu in kernels/, samples/ and tests/data/, compares
what each source says with what the kit's own parser (kitdispatch/describe/c_signature.py) reads:
parameter names and C types as written (what inference needs: `shapes = { x = ... }` names
them, `const` makes a buffer `in`, the C type gives a scalar's type). Times both per file.

libclang is run two ways: as it should be used, with the CUDA headers (`cuda_runtime.h` from
the nvidia-cuda-runtime wheel), and without them (CUDA's attributes defined by hand). The
compiler's view (NVRTC's PTX `.entry`) is counted too: it has sizes and order, no names.

    pip install libclang        # the PyPI wheel (18.1.1 when measured)
    python benchmarks/signature_sources.py
"""

from __future__ import annotations

import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kitdispatch.describe import c_signature as signature  # noqa: E402
from kitdispatch.compile.archs import Arch  # noqa: E402
from kitdispatch.compile.compilers import CompileOptions, NvrtcCompiler  # noqa: E402
from kitdispatch.compile.toolchain import find_nvrtc  # noqa: E402
from kitdispatch.check.ptx import parse_entries  # noqa: E402

CUDA_ATTRIBUTES = [
    "-D__global__=__attribute__((global))", "-D__device__=__attribute__((device))",
    "-D__host__=__attribute__((host))", "-D__shared__=__attribute__((shared))",
    "-D__launch_bounds__(...)=", "-D__forceinline__=inline", "-D__restrict__=__restrict",
]


def sources() -> list[Path]:
    return sorted(p for d in ("kernels", "samples", "tests/data") for p in (REPO / d).rglob("*.cu"))


def clang_kernels(index, ci, path: Path, with_headers: bool) -> tuple[dict, list[str]]:
    args = ["-x", "cuda", "--cuda-device-only", "-nocudainc", "-nocudalib", "--cuda-gpu-arch=sm_90",
            "-std=c++17", *(f"-I{d}" for d in find_nvrtc().include_dirs), f"-I{path.parent}"]
    args += ["-include", "cuda_runtime.h"] if with_headers else CUDA_ATTRIBUTES
    tu = index.parse(str(path), args=args, options=ci.TranslationUnit.PARSE_SKIP_FUNCTION_BODIES)
    errors = [str(d) for d in tu.diagnostics if d.severity >= ci.Diagnostic.Error]
    found: dict[str, list[tuple[str, str]]] = {}

    def walk(cursor):
        for c in cursor.get_children():
            if c.kind in (ci.CursorKind.NAMESPACE, ci.CursorKind.LINKAGE_SPEC, ci.CursorKind.UNEXPOSED_DECL):
                walk(c)
            elif c.kind in (ci.CursorKind.FUNCTION_DECL, ci.CursorKind.FUNCTION_TEMPLATE) and c.location.file \
                    and Path(c.location.file.name) == path and any(a.kind == ci.CursorKind.CUDAGLOBAL_ATTR for a in c.get_children()):
                found[c.spelling] = [(a.spelling, a.type.spelling) for a in c.get_children() if a.kind == ci.CursorKind.PARM_DECL]

    walk(tu.cursor)
    return found, errors


def normalized(params) -> list[tuple[str, str]]:
    return [(n, re.sub(r"\s+", " ", t.replace("__restrict__", "").replace("__restrict", "")).replace(" *", "*").strip()) for n, t in params]


def main() -> None:
    import clang.cindex as ci

    index = ci.Index.create()
    files = sources()
    times: dict[str, list[float]] = {"parser": [], "libclang+headers": [], "libclang bare": []}
    agree = {k: 0 for k in times}
    failed_files = {k: 0 for k in times}
    kernels = 0
    for path in files:
        text = path.read_text()
        signature._parsed.cache_clear()
        start = time.perf_counter()
        mine = signature.parse_kernels(text, path=str(path))
        times["parser"].append(time.perf_counter() - start)
        kernels += len(mine)
        agree["parser"] += len(mine)
        for way, headers in (("libclang+headers", True), ("libclang bare", False)):
            start = time.perf_counter()
            theirs, errors = clang_kernels(index, ci, path, headers)
            times[way].append(time.perf_counter() - start)
            failed_files[way] += bool(errors)
            agree[way] += sum(
                normalized((p.name, p.type) for p in sig.params) == normalized(theirs.get(name, [("?", "?")]))
                for name, sig in mine.items()
            )
    ptx = NvrtcCompiler().compile(REPO / "samples/simple_mul/simple_mul.cu", Arch.parse("sm_90"), "ptx", CompileOptions()).ptx
    entry = parse_entries(ptx.decode())["simple_mul"]
    print(f"{len(files)} sources, {kernels} kernels; libclang {ci.__file__}")
    print(f"{'source':<18} {'kernels read as the parser reads them':>38} {'files with errors':>18} {'median ms/file':>15} {'max ms':>8}")
    for way in times:
        print(f"{way:<18} {agree[way]:>38} {failed_files[way]:>18} {statistics.median(times[way]) * 1e3:>15.1f} {max(times[way]) * 1e3:>8.1f}")
    print(f"NVRTC PTX .entry of simple_mul: {[(p.name, p.size) for p in entry.params]} (no C names, no const)")


if __name__ == "__main__":
    main()
