"""The `kitdispatch` command: a thin layer over the Python API.

`main(argv, stdout, stderr)` runs in process, so tests drive it without a subprocess.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TextIO

from . import __version__
from .errors import KitError

EXIT_USAGE = 2


class _Out:
    """Where the CLI writes: results to stdout, progress and messages to stderr."""

    def __init__(self, stdout: TextIO, stderr: TextIO, verbosity: int, as_json: bool):
        self.stdout, self.stderr = stdout, stderr
        self.verbosity = verbosity
        self.as_json = as_json
        self._tty = hasattr(stderr, "isatty") and stderr.isatty()

    def info(self, text: str) -> None:
        if self.verbosity >= 0:
            print(text, file=self.stderr if self.as_json else self.stdout)

    def detail(self, text: str) -> None:
        if self.verbosity > 0:
            print(text, file=self.stderr)

    def progress(self, event) -> None:
        if self.verbosity < 0:
            return
        line = f"[{event.done}/{event.total}] {event.what} ({event.seconds:.2f} s)"
        if self._tty and self.verbosity == 0:
            end = "\n" if event.done == event.total else ""
            print(f"\r\033[K{line}", end=end, file=self.stderr, flush=True)
        else:
            print(line, file=self.stderr, flush=True)

    def result(self, data: dict, text: str) -> None:
        if self.as_json:
            print(json.dumps(data, indent=2), file=self.stdout)
        else:
            print(text, file=self.stdout)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=0, help="say more (commands, timings)")
    common.add_argument("-q", "--quiet", action="store_true", help="print only errors and results")
    common.add_argument("--json", action="store_true", help="print a machine-readable summary on stdout")

    building = argparse.ArgumentParser(add_help=False)
    building.add_argument("--arch", default="sm_80", help="target architectures, comma separated (default: sm_80)")
    building.add_argument("--compiler", choices=("nvrtc", "nvcc"), default="nvrtc", help="CUDA compiler (default: nvrtc from pip)")
    building.add_argument(
        "--format",
        choices=("ptx", "cubin", "fatbin"),
        default="fatbin",
        help="object format for kernels that set none (default: fatbin: SASS for each arch + PTX)",
    )
    building.add_argument("--min-driver", default=None, metavar="X.Y", help="oldest CUDA driver to load on (default: the local GPU's)")
    building.add_argument("-I", dest="include_dirs", action="append", default=[], metavar="DIR", help="include folder")
    building.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME[=VALUE]", help="preprocessor define")
    building.add_argument("--std", default="c++17", help="C++ standard (default: c++17)")
    building.add_argument("--fast-math", action="store_true", help="compile kernels with --use_fast_math")
    building.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: one per core)")
    building.add_argument("--no-cache", action="store_true", help="compile everything, read and write no cache")
    building.add_argument("--codegen-target", default=None, help="target for IREE-generated dispatches (default: chosen from --arch)")

    p = argparse.ArgumentParser(prog="kitdispatch", description="Hand-written CUDA kernels as IREE custom dispatches.")
    p.add_argument("--version", action="version", version=f"kitdispatch {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser("build", parents=[common, building], help="compile kernels, generate MLIR and link a .vmfb")
    g = sub.add_parser("gen", parents=[common, building], help="compile kernels and generate MLIR, no .vmfb")
    for cmd in (b, g):
        cmd.add_argument(
            "manifests", nargs="+", metavar="manifest",
            help="kitdispatch.toml, or the folder holding it; several build at once, sharing the cores",
        )
        cmd.add_argument(
            "-o", "--output", required=True,
            help="output folder (with several manifests: one folder per module inside it, named after the module)",
        )

    r = sub.add_parser("run", parents=[common], help="run a function of a .vmfb on the cuda device")
    r.add_argument("vmfb", help="the module to run")
    r.add_argument("--function", required=True, help="function to call")
    r.add_argument("--input", action="append", default=[], help="an input in IREE's syntax, e.g. 8xf32=2 (repeatable)")
    r.add_argument("--device", default="cuda", help="IREE device URI (default: cuda)")
    r.add_argument(
        "--benchmark", type=int, default=0, metavar="N",
        help="also time N calls: device time (CUPTI) against whole-call time, launched and synchronous",
    )

    t = sub.add_parser("test", parents=[common], help="build samples, run them on the GPU and check them against numpy")
    t.add_argument("paths", nargs="+", help="sample folders, build folders, or folders of them")
    t.add_argument("--arch", default="sm_80", help="architectures for samples that need building (default: sm_80)")
    t.add_argument("--compiler", choices=("nvrtc", "nvcc"), default="nvrtc")
    t.add_argument("--device", default="cuda", help="IREE device URI (default: cuda)")

    sub.add_parser("doctor", parents=[common], help="report the toolchain and the GPU")

    c = sub.add_parser("cache", parents=[common], help="show or clear the object cache")
    c.add_argument("action", choices=("info", "clear"), help="info: where and how big; clear: remove every entry")
    return p


def main(argv: list[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help/--version/usage errors
        return int(exc.code or 0)
    out = _Out(stdout, stderr, -1 if args.quiet else args.verbose, args.json)
    try:
        return _COMMANDS[args.command](args, out)
    except KitError as exc:
        print(f"kitdispatch {args.command}: error: {exc.render()}", file=stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("kitdispatch: interrupted", file=stderr)
        return 130


def console_main() -> None:
    sys.exit(main())


# ---------------------------------------------------------------------------- commands


def _build_options(args):
    from .build import BuildOptions
    from .compilers import CompileOptions

    return BuildOptions.create(
        args.arch,
        compiler=args.compiler,
        format=args.format,
        compile_options=CompileOptions(
            include_dirs=tuple(args.include_dirs),
            defines=tuple(args.defines),
            std=args.std,
            fast_math=args.fast_math,
        ),
        codegen_target=args.codegen_target,
        jobs=args.jobs,
        min_driver=args.min_driver,
        use_cache=not args.no_cache,
    )


def _cmd_build(args, out: _Out, *, make_vmfb: bool = True) -> int:
    from .build import build, build_all, generate, generate_all

    options = _build_options(args)
    if len(args.manifests) == 1:
        step = build if make_vmfb else generate
        results = (step(Path(args.manifests[0]), options, Path(args.output), progress=out.progress),)
    else:
        step = build_all if make_vmfb else generate_all
        results = step([Path(m) for m in args.manifests], options, Path(args.output), progress=out.progress)
    lines = []
    for result in results:
        for note in result.notes:
            out.info(f"note: {result.name}: {note}" if len(results) > 1 else f"note: {note}")
        made = result.vmfb or result.mlir
        lines.append(f"built {made}" if make_vmfb else f"generated {result.mlir} and {len(result.objects)} object file(s)")
        out.detail(f"{result.name}: compiler runs: {result.compiler_runs}, iree-compile runs: {result.iree_compile_runs}")
    data = results[0].to_json() if len(results) == 1 else {"modules": [r.to_json() for r in results]}
    out.result(data, "\n".join(lines))
    return 0


def _cmd_gen(args, out: _Out) -> int:
    return _cmd_build(args, out, make_vmfb=False)


def _cmd_run(args, out: _Out) -> int:
    from .runtime import read_signatures, run_function, run_module

    if args.function not in read_signatures(Path(args.vmfb)) and not args.benchmark:
        res = run_module(Path(args.vmfb), args.function, args.input, device=args.device)  # not built by kitdispatch
        out.detail(f"$ {' '.join(res.argv)}")
        out.result({"function": args.function, "output": res.stdout}, res.stdout.rstrip())
        return 0
    run = run_function(Path(args.vmfb), args.function, args.input, device=args.device, benchmark=args.benchmark)
    lines = [f"EXEC @{run.function}", *run.results]
    if run.times:
        anchor = ["iree-benchmark-module", f"--device={args.device}", f"--module={args.vmfb}", f"--function={args.function}"]
        lines += [*run.times.lines(run.function), "  IREE's own tool, to compare: " + shlex.join(anchor + [f"--input={i}" for i in args.input])]
    text = "\n".join(lines)
    data = {"function": run.function, "output": "\n".join(run.results), "benchmark": run.times.to_json() if run.times else None}
    out.result(data, text)
    return 0


def _cmd_test(args, out: _Out) -> int:
    from .verify import format_table, verify

    def build_sample(sample: Path, dest: Path) -> Path:
        from .build import BuildOptions, build

        options = BuildOptions.create(args.arch, compiler=args.compiler)
        return build(sample, options, dest, progress=out.progress).record

    report = verify(args.paths, build_module=build_sample, device=args.device, log=out.detail)
    if not out.as_json:
        out.info(f"device: {report.device}")
    out.result(report.to_json(), format_table(report) + "\n" + report.summary())
    if out.as_json:
        print(report.summary(), file=out.stderr)
    return 0 if report.ok else 1


def _cmd_doctor(args, out: _Out) -> int:
    from .doctor import collect, format_report

    report = collect()
    out.result(report, format_report(report))
    return 0


def _cmd_cache(args, out: _Out) -> int:
    from .cache import Cache

    cache = Cache()
    if args.action == "clear":
        n = cache.clear()
        out.result({"path": str(cache.root), "removed": n}, f"removed {n} entries from {cache.root}")
        return 0
    info = cache.info()
    text = (
        f"cache  {info['path']}{'' if info['usable'] else ' (not usable, see the warning)'}\n"
        f"size   {info['entries']} entries, {info['bytes'] / 1e6:.1f} MB of {info['max_bytes'] / 1e6:.0f} MB"
    )
    out.result(info, text)
    return 0


_COMMANDS = {"build": _cmd_build, "gen": _cmd_gen, "run": _cmd_run, "test": _cmd_test, "doctor": _cmd_doctor, "cache": _cmd_cache}
