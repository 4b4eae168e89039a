"""Compatibility matrix: for each IREE release and CUDA major, a fresh venv with the kit
installed from this checkout as users install it, every sample and library kernel built, and
a table of the results.

    python tools/compat.py                              # IREE 3.10-3.13 x CUDA 12, 13
    python tools/compat.py --iree 3.10,3.13 --cuda 13   # what CI has time for
    python tools/compat.py --python python3.10 --iree 3.13 --markdown

Per cell: `pip install '<checkout>[build]'` (CUDA 13) or `'<checkout>[cu12]'` (CUDA 12) with
`iree-base-compiler` and `iree-base-runtime` pinned to the release, in a venv under --root
(reused with --reuse); `kitdispatch doctor --json` for the versions; then, from a folder
outside the checkout so that the installed kit is the one imported, one `kitdispatch build`
of every sample and library kernel for the cell's architectures (the matmul, sm_80 and newer,
for those of them it runs on), and a check that a cp.async kernel's PTX (kernels/attention_f32)
for the oldest architecture is refused (cp.async needs sm_80). Exit status 1 when any cell fails.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IREE_RELEASES = ("3.10", "3.11", "3.12", "3.13")
CUDA_MAJORS = ("12", "13")
# The oldest architecture each CUDA major's NVRTC has (Volta with CUDA 12), then Ampere and Hopper.
ARCHS = {"12": ("sm_70", "sm_80", "sm_90"), "13": ("sm_75", "sm_80", "sm_90")}
EXTRA = {"12": "cu12", "13": "build"}
SAMPLES = sorted(p.parent for p in (REPO / "samples").glob("*/kitdispatch.toml"))
LIBRARY = sorted(p.parent for p in (REPO / "kernels").glob("*/kitdispatch.toml"))
NEEDS_SM80 = {"matmul", "attention", "attention_f32", "norm"}  # cp.async (attention_f32 too), ldmatrix, mma.sync.m16n8k16
REFUSED_BELOW_SM80 = "attention_f32"  # the library folder whose PTX for the oldest architecture must be refused
PIP_TIMEOUT_S = 1800
BUILD_TIMEOUT_S = 1800


@dataclass
class Cell:
    iree: str
    cuda: str
    python: str = ""
    nvrtc: str = ""
    iree_installed: str = ""
    codegen: str = ""
    built: int = 0
    total: int = 0
    refused_ok: bool = False
    install_s: float = 0.0
    build_s: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and self.built == self.total and self.refused_ok


def run(argv: list[str], *, timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def python_version(python: str) -> str:
    res = run([python, "-c", "import sys; print('.'.join(map(str, sys.version_info[:3])))"], timeout=60)
    return res.stdout.strip()


def make_venv(cell: Cell, python: str, root: Path, reuse: bool) -> Path:
    venv = root / f"iree-{cell.iree}-cu{cell.cuda}-py{python_version(python).rsplit('.', 1)[0]}"
    bin_dir = venv / "bin"
    if reuse and (bin_dir / "kitdispatch").exists():
        # Refresh the kit only: the toolchain is what the cell is about and it is pinned.
        install = [str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(REPO)]
    else:
        if venv.exists():
            shutil.rmtree(venv)
        res = run([python, "-m", "venv", str(venv)], timeout=300)
        if res.returncode != 0:
            raise RuntimeError(f"venv failed: {res.stderr[-2000:]}")
        install = [
            str(bin_dir / "python"), "-m", "pip", "install", "-q",
            f"{REPO}[{EXTRA[cell.cuda]}]",
            f"iree-base-compiler=={cell.iree}.*",
            f"iree-base-runtime=={cell.iree}.*",
        ]
    start = time.perf_counter()
    res = run(install, timeout=PIP_TIMEOUT_S)
    cell.install_s = time.perf_counter() - start
    if res.returncode != 0:
        raise RuntimeError(f"pip install failed: {res.stderr[-3000:]}")
    return bin_dir


def describe(cell: Cell, bin_dir: Path) -> None:
    res = run([str(bin_dir / "kitdispatch"), "doctor", "--json"], timeout=300)
    report = json.loads(res.stdout)
    nvrtc = report["nvrtc"]
    cell.nvrtc = f"{nvrtc.get('version', '-')} (PTX {nvrtc.get('ptx_isa', '-')})" if "error" not in nvrtc else nvrtc["error"]
    cell.iree_installed = report["iree_compiler"] or "-"
    cell.python = python_version(str(bin_dir / "python"))


def build_everything(cell: Cell, bin_dir: Path, out: Path) -> None:
    archs = ARCHS[cell.cuda]
    everyday = [p for p in SAMPLES + LIBRARY if p.name not in NEEDS_SM80]
    newer = [p for p in LIBRARY if p.name in NEEDS_SM80]
    cell.total = len(everyday) + len(newer)
    start = time.perf_counter()
    for modules, targets in ((everyday, archs), (newer, [a for a in archs if int(a[3:]) >= 80])):
        res = run(
            [str(bin_dir / "kitdispatch"), "build", *map(str, modules), "--arch", ",".join(targets),
             "-o", str(out), "--json", "--no-cache"],
            timeout=BUILD_TIMEOUT_S, cwd=out.parent,
        )
        if res.returncode != 0:
            cell.errors.append(_excerpt(res.stderr))
            continue
        summary = json.loads(res.stdout)
        results = summary if isinstance(summary, list) else summary.get("modules", [summary])
        cell.built += sum(1 for r in results if r.get("vmfb") and Path(r["vmfb"]).is_file())
        cell.codegen = cell.codegen or results[0].get("codegen_target", "")
    cell.build_s = time.perf_counter() - start
    # A cp.async kernel as PTX for the oldest architecture must be refused, with the instruction:
    # kernels/attention_f32, one source (the matmul's five took 10 of the cell's 26 minutes on CI's cores).
    res = run(
        [str(bin_dir / "kitdispatch"), "gen", str(REPO / "kernels" / REFUSED_BELOW_SM80), "--arch", archs[0], "--format", "ptx",
         "-o", str(out / "refused"), "--no-cache"],
        timeout=BUILD_TIMEOUT_S, cwd=out.parent,
    )
    cell.refused_ok = res.returncode == 2 and "cp.async" in res.stderr
    if not cell.refused_ok:
        cell.errors.append(f"{REFUSED_BELOW_SM80} for {archs[0]} was not refused as expected (exit {res.returncode}): {res.stderr[-500:]}")


def _excerpt(stderr: str) -> str:
    """The kit's error line and what ends the output: its first and last lines say what failed."""
    text = stderr.strip()
    return text if len(text) <= 2000 else f"{text[:800]}\n...\n{text[-1200:]}"


def run_cell(cell: Cell, python: str, root: Path, reuse: bool) -> Cell:
    try:
        bin_dir = make_venv(cell, python, root, reuse)
        describe(cell, bin_dir)
        with tempfile.TemporaryDirectory(prefix="kitdispatch-compat-") as tmp:
            out = Path(tmp) / "out"
            out.mkdir()
            build_everything(cell, bin_dir, out)
    except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        cell.errors.append(str(exc))
    return cell


def table(cells: list[Cell]) -> str:
    lines = [
        "| IREE | CUDA | Python | NVRTC | archs | IREE codegen | built | cp.async refused below sm_80 | install | build |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | ---: | ---: |",
    ]
    for c in cells:
        lines.append(
            f"| {c.iree_installed or c.iree} | {c.cuda} | {c.python} | {c.nvrtc} | {', '.join(ARCHS[c.cuda])} | {c.codegen or '-'} "
            f"| {c.built}/{c.total} | {'yes' if c.refused_ok else 'no'} | {c.install_s:.0f} s | {c.build_s:.1f} s |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iree", default=",".join(IREE_RELEASES), help="IREE releases (default: %(default)s)")
    p.add_argument("--cuda", default=",".join(CUDA_MAJORS), help="CUDA majors (default: %(default)s)")
    p.add_argument("--python", default=sys.executable, help="the interpreter for the venvs (default: this one)")
    p.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "kitdispatch-compat"), help="where the venvs go")
    p.add_argument("--reuse", action="store_true", help="keep a cell's venv from an earlier run (reinstalls the kit only)")
    p.add_argument("--markdown", action="store_true", help="print the table with the date, for the README")
    args = p.parse_args(argv)
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    cells = []
    start = time.perf_counter()
    for iree in args.iree.split(","):
        for cuda in args.cuda.split(","):
            print(f"IREE {iree}, CUDA {cuda} ...", file=sys.stderr, flush=True)
            cell = run_cell(Cell(iree, cuda), args.python, root, args.reuse)
            print(f"  {'ok' if cell.ok else 'FAILED'}: {cell.built}/{cell.total} built", file=sys.stderr, flush=True)
            for error in cell.errors:
                print("  " + error.replace("\n", "\n  "), file=sys.stderr)
            cells.append(cell)
    if args.markdown:
        print(f"Measured {datetime.date.today().isoformat()} by `python tools/compat.py` in {time.perf_counter() - start:.0f} s:\n")
    print(table(cells))
    return 0 if all(c.ok for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
