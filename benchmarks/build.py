"""Build-speed benchmark: every sample for sm_80, sm_89 and sm_90, four ways, in one run.

(a) the IREE sample's way: one `nvcc -ptx` process per source per architecture, then
    iree-compile as a subprocess (the MLIR is written beforehand, as a user would have it);
(b) kitdispatch with an empty cache; (c) kitdispatch again, nothing changed;
(d) kitdispatch after editing one kernel.

kitdispatch builds every sample in one call (`build_all`, as `kitdispatch build samples/*`).
For context it also times (a) with its commands run N at a time, as `make -jN` would, and
kitdispatch one sample at a time, and with PTX objects like (a)'s.

Each way runs in its own process, which reports its wall time (after interpreter start and
imports), its peak memory (its own or its largest child's) and how many compiler and
iree-compile runs it made.

    python benchmarks/build.py            # prints the table and the ratios
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from kitdispatch._parallel import default_jobs  # noqa: E402  (the bound kitdispatch itself uses)

JOBS = default_jobs()
ARCHS = "sm_80,sm_89,sm_90"


def samples(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob("*/kitdispatch.toml"))


def peak_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) / 1024


# ------------------------------------------------------------------------------ ways


def way_iree_sample(work: Path, jobs: int = 1) -> dict:
    """nvcc per source per arch, then iree-compile, as IREE's CMake sample does; `jobs` > 1
    runs the commands of each stage that many at a time, as `make -jN` would."""
    from concurrent.futures import ThreadPoolExecutor

    from kitdispatch import load_manifest
    from kitdispatch.iree.tools import find_iree_compile

    nvcc, iree_compile = shutil.which("nvcc"), find_iree_compile()
    ptx_commands, link_commands = [], []
    for sample in samples(work / "samples"):
        spec = load_manifest(sample)
        out = work / "a" / sample.name
        for src in dict.fromkeys(spec.source_path(k.source) for k in spec.kernels):
            for arch in ARCHS.split(","):
                ptx_commands.append([nvcc, "-ptx", f"-arch=compute_{arch[3:]}", "-o", str(out / f"{src.stem}.{arch}.ptx"), str(src)])
        link_commands.append(
            [iree_compile, str(out / f"{spec.name}.mlir"), "--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80",
             f"--iree-hal-executable-object-search-path={out}", "--iree-opt-const-eval=false", "-o", str(out / f"{spec.name}.vmfb")]
        )
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for commands in (ptx_commands, link_commands):
            list(pool.map(lambda argv: subprocess.run(argv, check=True, timeout=600), commands))
    return {"compiler_runs": len(ptx_commands), "iree_compile_runs": len(link_commands)}


def way_kitdispatch(work: Path, tag: str) -> dict:
    from kitdispatch import BuildOptions, build_all
    from kitdispatch import build

    # "p": the same objects as (a), PTX per architecture, to compare like with like.
    options = BuildOptions.create(ARCHS, **({"format": "ptx"} if tag == "p" else {}))
    # (b), (c) and (d) are one command run three times: the same output folder.
    out = work / ("kd" if tag in "bcd" else tag)
    if tag == "s":  # one build() call per sample, one after another
        results = [build(sample, options, out / sample.name) for sample in samples(work / "samples")]
    else:
        results = build_all(samples(work / "samples"), options, out)
    return {"compiler_runs": sum(r.compiler_runs for r in results), "iree_compile_runs": sum(r.iree_compile_runs for r in results)}


def child(way: str, work: Path) -> None:
    import kitdispatch.builder.pipeline  # noqa: F401  (interpreter start and imports stay out of every way's time)

    start = time.perf_counter()
    if way in ("a", "j"):
        counts = way_iree_sample(work, jobs=1 if way == "a" else JOBS)
    else:
        counts = way_kitdispatch(work, way)
    print(json.dumps({"seconds": time.perf_counter() - start, "peak_mb": peak_mb(), **counts}))


# ----------------------------------------------------------------------------- driver


def run_way(way: str, work: Path, env: dict) -> dict:
    res = subprocess.run(
        [sys.executable, __file__, "--child", way, "--work", str(work)],
        capture_output=True, text=True, env=env, timeout=1800,
    )
    if res.returncode != 0:
        sys.exit(f"way ({way}) failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def prepare(work: Path, env: dict) -> None:
    """A private copy of the samples, and the MLIR that way (a) compiles (PTX objects)."""
    shutil.copytree(REPO / "samples", work / "samples")
    shutil.copytree(REPO / "kernels", work / "kernels")  # samples may include library kernels
    for sample in samples(work / "samples"):
        res = subprocess.run(
            [sys.executable, "-m", "kitdispatch", "gen", str(sample), "--arch", ARCHS, "--format", "ptx",
             "--no-cache", "-q", "-o", str(work / "a" / sample.name)],
            env=env, timeout=600, capture_output=True, text=True,
        )
        if res.returncode != 0:
            sys.exit(f"cannot prepare {sample.name}:\n{res.stderr}")


def edit_one_kernel(work: Path) -> Path:
    """A change the compiler sees (a comment alone leaves the object bytes, and so the
    module, unchanged: kitdispatch then skips the link too)."""
    src = sorted((work / "samples").glob("*/*.cu"))[0]
    src.write_text(src.read_text() + '\nextern "C" __global__ void benchmark_edit(int* x) { x[0] = 1; }\n')
    return src


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", choices=("a", "j", "b", "c", "d", "s", "p"))
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.work)

    with tempfile.TemporaryDirectory(prefix="kitdispatch-bench-") as tmp:
        work = Path(tmp)
        # The checkout first; a PYTHONPATH already set (where the toolchain was put) stays.
        pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "KITDISPATCH_CACHE_DIR": str(work / "cache"), "PYTHONPATH": pythonpath}
        prepare(work, env)
        n = len(samples(work / "samples"))
        results = {way: run_way(way, work, env) for way in ("a", "j")}
        for way in ("s", "p"):  # each with an empty cache of its own
            results[way] = run_way(way, work, {**env, "KITDISPATCH_CACHE_DIR": str(work / f"cache-{way}")})
        results |= {way: run_way(way, work, env) for way in ("b", "c")}
        edited = edit_one_kernel(work)
        results["d"] = run_way("d", work, env)

    names = {
        "a": "(a) nvcc -ptx per source/arch + iree-compile",
        "b": "(b) kitdispatch, empty cache",
        "c": "(c) kitdispatch, nothing changed",
        "d": f"(d) kitdispatch, {edited.name} edited",
        "j": f"    (a), {JOBS} commands at a time (make -j{JOBS})",
        "s": "    (b), one build() per sample in turn",
        "p": "    (b), --format ptx: (a)'s objects",
    }
    import importlib.util

    link = "in process (iree.compiler.api)" if importlib.util.find_spec("iree.compiler") else "iree-compile subprocess"
    print(f"{n} samples x 3 architectures ({ARCHS}), {JOBS} cores; kitdispatch links {link}\n")
    print(f"{'build':<48} {'seconds':>8} {'peak MB':>8} {'compiler runs':>14} {'iree-compile runs':>18}")
    for k in names:
        r = results[k]
        print(f"{names[k]:<48} {r['seconds']:>8.3f} {r['peak_mb']:>8.0f} {r['compiler_runs']:>14} {r['iree_compile_runs']:>18}")
    a, b, c = (results[k]["seconds"] for k in "abc")
    print(f"\n(a)/(b) speed-up: {a / b:.2f}x   (target >= 5x)")
    print(f"  for context: (a -j{JOBS})/(b) {results['j']['seconds'] / b:.2f}x, (a)/(b one per sample) "
          f"{a / results['s']['seconds']:.2f}x, (a)/(b ptx) {a / results['p']['seconds']:.2f}x")
    print(f"(c)/(b): {100 * c / b:.1f}% of (b)   (target <= 5%), compiler + iree-compile runs in (c): "
          f"{results['c']['compiler_runs'] + results['c']['iree_compile_runs']}   (target 0)")
    print(f"(d): {results['d']['compiler_runs']} compiler run(s), {results['d']['iree_compile_runs']} iree-compile run(s)   "
          "(target: only the edited kernel's objects and its module)")


if __name__ == "__main__":
    main()
