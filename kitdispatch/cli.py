"""The `kitdispatch` command: a thin layer over the Python API.

`main(argv, stdout, stderr)` runs in process, so tests drive it without a subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from kitdispatch._version import __version__
from kitdispatch.describe.choices import DEFAULT_ARCHS, DEFAULT_COMPILER, DEFAULT_FORMAT, CompilerName, ObjectFormat
from kitdispatch.describe.limits import COMPILE_TIMEOUT_S, IREE_COMPILE_TIMEOUT_S, MAX_TIMEOUT_S
from kitdispatch.errors import KitError

if TYPE_CHECKING:
    from types import FrameType

    from kitdispatch.builder.options import BuildOptions
    from kitdispatch.builder.pipeline import ProgressEvent

EXIT_USAGE = 2
EXIT_NOTHING_CHECKED = 5  # as pytest: the command ran, but no check did
EXIT_INTERNAL = 70  # EX_SOFTWARE: a kitdispatch bug, not the user's input


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

    def progress(self, event: ProgressEvent) -> None:
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
    building.add_argument("--arch", default=DEFAULT_ARCHS, help=f"target architectures, comma separated (default: {DEFAULT_ARCHS})")
    building.add_argument("--compiler", choices=CompilerName.choices(), default=str(DEFAULT_COMPILER), help=f"CUDA compiler (default: {DEFAULT_COMPILER} from pip)")
    building.add_argument(
        "--format",
        choices=ObjectFormat.choices(),
        default=str(DEFAULT_FORMAT),
        help=f"object format for kernels that set none (default: {DEFAULT_FORMAT}: SASS for each arch + PTX)",
    )
    building.add_argument("--min-driver", default=None, metavar="X.Y", help="oldest CUDA driver to load on (default: the local GPU's)")
    building.add_argument("-I", dest="include_dirs", action="append", default=[], metavar="DIR", help="include folder")
    building.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME[=VALUE]", help="preprocessor define")
    building.add_argument("--std", default="c++17", help="C++ standard (default: c++17)")
    building.add_argument("--fast-math", action="store_true", help="compile kernels with --use_fast_math")
    building.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: one per core)")
    building.add_argument("--no-cache", action="store_true", help="compile everything, read and write no cache")
    building.add_argument("--codegen-target", default=None, help="target for IREE-generated dispatches (default: chosen from --arch)")
    building.add_argument(
        "--timeout", type=float, default=None, metavar="SECONDS",
        help=f"longest a compiler run or a link may take before it is stopped (default: {COMPILE_TIMEOUT_S:g} and {IREE_COMPILE_TIMEOUT_S:g})",
    )

    p = argparse.ArgumentParser(prog="kitdispatch", description="Hand-written CUDA kernels as IREE custom dispatches.")
    p.add_argument("--version", action="version", version=f"kitdispatch {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser("build", parents=[common, building], help="compile kernels, generate MLIR and link a .vmfb")
    g = sub.add_parser("gen", parents=[common, building], help="compile kernels and generate MLIR, no .vmfb")
    for cmd in (b, g):
        cmd.add_argument(
            "manifests", nargs="*", metavar="manifest",
            help="kitdispatch.toml, or the folder holding it; several build at once, sharing the cores "
            "(with --model: the projects whose kernels replace its ops, first ones first, before the library's)",
        )
        cmd.add_argument(
            "-o", "--output", required=True,
            help="output folder (with several manifests: one folder per module inside it, named after the module)",
        )
    b.add_argument(
        "--model", default=None,
        help="a model (.mlir, .onnx) whose ops the kernels that declare `replaces` replace: the manifests' first, then the library's",
    )
    b.add_argument("--no-library", action="store_true", help="with --model: only the manifests' kernels, not the kit's library")
    b.add_argument("--with-baseline", action="store_true", help="with --model: also compile the model with IREE alone")
    b.add_argument(
        "--tf32", action="store_true",
        help="with --model: f32 matmuls may run in plain TF32 (faster, ~1e-3 relative error; default 3xTF32, f32-level)",
    )

    b.add_argument("--probes", action="store_true", help="with --model: also write what `kitdispatch tune DIR` measures (a probe per replaced op)")
    b.add_argument("--tuned", default=None, metavar="FILE",
                   help="with --model: keep IREE's own op where FILE (NAME.tune.json, written by tune) says the kernel is slower or differs")
    b.add_argument("--tune", action="store_true",
                   help="with --model: build with probes, tune on this machine's GPU, rebuild keeping only the replacements that are right "
                   "and faster (without a GPU: build by rule, and say so)")
    b.add_argument("--tune-inputs", default=None, metavar="FILE.npz", help="with --tune: the model's inputs to tune on (default: random, as compare draws them)")
    b.add_argument("--parameters", default=None, metavar="FILE.irpa", help="with --tune: the weights of a model imported with them externalized")

    tun = sub.add_parser("tune", parents=[common], help="time and check each replaced op of a model build on its own activations, on the GPU")
    tun.add_argument("built", help="a folder written by `build --model MODEL -o DIR --probes`")
    tun.add_argument("--device", default="cuda", help="IREE device URI (default: cuda)")
    cmp = sub.add_parser("compare", parents=[common], help="run a model with and without its replacements on the GPU")
    cmp.add_argument("built", help="a folder written by `build PROJECT --model MODEL --with-baseline -o DIR`")
    prof = sub.add_parser("profile", parents=[common], help="a model's dispatches on the GPU: time, rate against peak, the kernel that stands in")
    prof.add_argument("built", help="a folder written by `build ... --model MODEL` (its kit build is profiled)")
    prof.add_argument("--baseline", action="store_true", help="profile IREE's own build (built with --with-baseline) instead of the kit's")
    for cmd in (cmp, prof, tun):
        cmd.add_argument("--inputs", default=None, metavar="FILE.npz", help="inputs in argument order (default: random by dtype)")
        cmd.add_argument("--function", default=None, help="function to run (default: the model's first)")
        if cmd is not tun:
            cmd.add_argument("--device", default="cuda", help="IREE device URI (default: cuda)")
        cmd.add_argument("--parameters", default=None, metavar="FILE.irpa",
                         help="the weights of a model imported with them externalized (iree-import-onnx --externalize-params)")

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
    t.add_argument("--arch", default=DEFAULT_ARCHS, help=f"architectures for samples that need building (default: {DEFAULT_ARCHS})")
    t.add_argument("--compiler", choices=CompilerName.choices(), default=str(DEFAULT_COMPILER))
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
        with _argparse_output(stdout, stderr):
            args = parser.parse_args(argv)
            _check_usage(parser, args)
    except SystemExit as exc:  # argparse exits on --help/--version/usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    out = _Out(stdout, stderr, -1 if args.quiet else args.verbose, args.json)
    try:
        with _warnings_as_lines(out), _terminate_as_interrupt():
            return _COMMANDS[args.command](args, out)
    except KitError as exc:
        print(f"kitdispatch {args.command}: error: {exc.render()}", file=stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("kitdispatch: interrupted", file=stderr)
        return 130
    except OSError as exc:  # a file or folder the command was pointed at
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"kitdispatch {args.command}: error: {exc.strerror or exc}{where}\n  fix: check the path and its permissions", file=stderr)
        return 1
    except Exception as exc:  # a kitdispatch bug: one line, the traceback only when asked for
        if args.verbose:
            traceback.print_exc(file=stderr)
        print(
            f"kitdispatch {args.command}: internal error: {type(exc).__name__}: {exc}\n"
            "  this is a kitdispatch bug; please report it with the command"
            + ("" if args.verbose else " (re-run with -v for the traceback)"),
            file=stderr,
        )
        return EXIT_INTERNAL


_PATH_OPTIONS = {"output": "-o/--output", "model": "--model", "tuned": "--tuned", "tune_inputs": "--tune-inputs", "inputs": "--inputs", "vmfb": "vmfb", "built": "built"}
_PATH_LISTS = {"manifests": "manifest", "paths": "paths", "include_dirs": "-I"}


def _check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse cannot say: options that need another, and empty paths (`-o ''` would
    be the current folder)."""
    if getattr(args, "with_baseline", False) and not getattr(args, "model", None):
        parser.error("--with-baseline needs --model MODEL (it compiles that model with IREE alone)")
    if getattr(args, "tf32", False) and not getattr(args, "model", None):
        parser.error("--tf32 needs --model MODEL (it chooses the kernels of a model's f32 matmuls)")
    for flag in ("probes", "tuned", "tune"):
        if getattr(args, flag, None) and not getattr(args, "model", None):
            parser.error(f"--{flag} needs --model MODEL (it concerns the replaced ops of a model)")
    if getattr(args, "command", None) == "build" and not args.tune and (args.tune_inputs or args.parameters):
        parser.error("--tune-inputs and --parameters need --tune (they are the inputs and weights tune runs the model with)")
    if getattr(args, "tune", False) and getattr(args, "tuned", None):
        parser.error("--tune measures and writes its own tune file; --tuned FILE reads one: give one of them")
    if getattr(args, "no_library", False) and not getattr(args, "model", None):
        parser.error("--no-library needs --model MODEL (the library's kernels replace a model's ops)")
    if getattr(args, "command", None) in ("build", "gen") and not args.manifests and not getattr(args, "model", None):
        parser.error("give a manifest (kitdispatch.toml or its folder), or --model MODEL to build a model with the library")
    if getattr(args, "jobs", None) is not None and args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give at least 1, or leave it out for one per core")
    timeout = getattr(args, "timeout", None)
    if timeout is not None and not (0 < timeout < MAX_TIMEOUT_S):
        parser.error(f"--timeout {timeout}: give a positive number of seconds below {MAX_TIMEOUT_S:g}")
    if getattr(args, "benchmark", 0) < 0:
        parser.error(f"--benchmark {args.benchmark}: give the number of calls to time (0: none)")
    for dest, shown in _PATH_OPTIONS.items():
        if getattr(args, dest, None) == "":
            parser.error(f"{shown} is an empty path; give a file or folder name ('.' for the current folder)")
    for dest, shown in _PATH_LISTS.items():
        if "" in (getattr(args, dest, None) or ()):
            parser.error(f"{shown}: an empty path; give a file or folder name ('.' for the current folder)")


@contextmanager
def _argparse_output(stdout: TextIO, stderr: TextIO):
    """argparse prints to sys.stdout/sys.stderr; send that where main() was told to."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = stdout, stderr
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


@contextmanager
def _terminate_as_interrupt():
    """SIGTERM (a `kill`, a job scheduler's stop) ends a command as Ctrl-C does: the same
    cleanup of workers, tools and staging folders, and exit 130. Only the main thread may
    set a handler; the previous one comes back afterwards (main() also runs in-process)."""
    def interrupt(signum: int, frame: FrameType | None):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: SIGTERM keeps its default
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _warnings_as_lines(out: "_Out"):
    """The kit's warnings (an unusable cache, ...) as one `warning:` line each, not Python's
    file:line warning format."""
    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: TextIO | None = None, line: str | None = None):
        if out.verbosity >= 0:
            print(f"kitdispatch: warning: {message}", file=out.stderr)

    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = show
        yield


def console_main() -> None:
    try:
        code = main()
    except KeyboardInterrupt:  # between main's own handler and here
        print("kitdispatch: interrupted", file=sys.stderr)
        code = 130
    # The command is done; a Ctrl-C while Python shuts down (workers, atexit) ends it at once.
    signal.signal(signal.SIGINT, _interrupted_while_exiting)
    sys.exit(code)


def _interrupted_while_exiting(signum: int, frame: FrameType | None) -> None:
    """Exit 130 with no traceback. Compiler workers notice their parent has gone and exit
    (_worker_main.py); the atexit hook that kills them may be what this interrupts."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(130)


# ---------------------------------------------------------------------------- commands


def _build_options(args: argparse.Namespace) -> BuildOptions:
    from kitdispatch.builder.options import BuildOptions
    from kitdispatch.compile.compilers import CompileOptions

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
        **({"compile_timeout": args.timeout, "link_timeout": args.timeout} if args.timeout is not None else {}),
    )


def _cmd_build(args: argparse.Namespace, out: _Out, *, make_vmfb: bool = True) -> int:
    from kitdispatch.builder.pipeline import build, build_all, generate, generate_all

    options = _build_options(args)
    if getattr(args, "model", None):
        return _build_model(args, options, out)
    if len(args.manifests) == 1:
        step = build if make_vmfb else generate
        results = (step(Path(args.manifests[0]), options, Path(args.output), progress=out.progress),)
    else:
        step = build_all if make_vmfb else generate_all
        results = step([Path(m) for m in args.manifests], options, Path(args.output), progress=out.progress)
    lines = []
    for result in results:
        prefix = f"{result.name}: " if len(results) > 1 else ""
        for note in result.notes:
            out.info(f"note: {prefix}{note}")
        for d in result.diagnostics:
            out.info(f"warning: {prefix}{d.tool}: {d.where}:\n" + "\n".join("  " + line for line in d.text.splitlines()))
        for kernel, names in result.names.items():
            out.info(f"note: {prefix}kernel {kernel!r}: function {names['function']!r}, entry {names['entry']!r}")
        for name in result.removed:
            out.detail(f"{prefix}removed {name} (written by the folder's previous build)")
        for command in result.commands:
            out.detail(f"{prefix}ran: {command}")
        made = result.vmfb or result.mlir
        lines.append(f"built {made}" if make_vmfb else f"generated {result.mlir} and {len(result.objects)} object file(s)")
        out.detail(f"{result.name}: compiler runs: {result.compiler_runs}, iree-compile runs: {result.iree_compile_runs}")
    data = results[0].to_json() if len(results) == 1 else {"modules": [r.to_json() for r in results]}
    out.result(data, "\n".join(lines))
    return 0


def _build_model(args: argparse.Namespace, options: BuildOptions, out: _Out) -> int:
    from kitdispatch.models.pipeline import ModelBuildFailed, build_model, format_report

    def build(**tuning: object):
        return build_model(
            [Path(m) for m in args.manifests] or None, Path(args.model), options, Path(args.output),
            library=not args.no_library, with_baseline=args.with_baseline, tf32=args.tf32, **tuning,
        )

    try:
        result = _tuned_build(args, build, out) if args.tune else build(probes=args.probes, tuned=args.tuned)
    except ModelBuildFailed as exc:
        if out.as_json:  # the decisions, as the report in the folder has them; the error on stderr
            out.result(exc.report, "")
        raise
    text = format_report(args.model, result.decisions) + f"\nbuilt {result.vmfb}"
    if result.baseline_vmfb:
        text += f" and {result.baseline_vmfb}"
    out.result(result.to_json(), text)
    return 0


def _tuned_build(args: argparse.Namespace, build: object, out: _Out) -> object:
    """`build --tune`: with probes, tune on this machine's GPU, then rebuild with the tune file;
    without a GPU, by rule, saying so on stderr and in the report."""
    from kitdispatch.models.tune import format_tune, tune_model
    from kitdispatch.run.module import cuda_status

    status = cuda_status()
    if not status.available:
        reason = f"--tune needs a GPU: {status.reason}; the build replaces by rule"
        print(f"kitdispatch build: note: {reason}", file=out.stderr)
        return build(probes=args.probes, untuned_reason=reason)
    probed = build(probes=True)
    tuned = tune_model(probed.out_dir, inputs=args.tune_inputs, parameters=args.parameters)
    out.info(format_tune(tuned))
    return build(probes=args.probes, tuned=tuned.path)


def _cmd_tune(args: argparse.Namespace, out: _Out) -> int:
    from kitdispatch.models.tune import format_tune, tune_model

    result = tune_model(Path(args.built), inputs=args.inputs, parameters=args.parameters, function=args.function, device=args.device)
    out.result(result.to_json(), format_tune(result))
    if not any(e.kit_us is not None and e.iree_us is not None for e in result.record.entries):
        # "green" means measured: every op then follows the rule, which a build without --tuned gives too
        print("kitdispatch tune: no probe was measured (see the reasons above); the record decides nothing", file=out.stderr)
        return 1
    return 0


def _cmd_compare(args: argparse.Namespace, out: _Out) -> int:
    from kitdispatch.models.compare import compare_model, format_comparison

    result = compare_model(Path(args.built), inputs=args.inputs, function=args.function, device=args.device, parameters=args.parameters)
    out.result(result.to_json(), format_comparison(result))
    return 0 if result.agree else 1


def _cmd_profile(args: argparse.Namespace, out: _Out) -> int:
    from kitdispatch.models.compare import format_profile, profile_module

    result = profile_module(
        Path(args.built), inputs=args.inputs, function=args.function, device=args.device, parameters=args.parameters, baseline=args.baseline,
    )
    out.result(result.to_json(), format_profile(result))
    return 0


def _cmd_gen(args: argparse.Namespace, out: _Out) -> int:
    return _cmd_build(args, out, make_vmfb=False)


def _cmd_run(args: argparse.Namespace, out: _Out) -> int:
    from kitdispatch.run.module import read_signatures
    from kitdispatch.run.cli_calls import run_function, run_module

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


def _cmd_test(args: argparse.Namespace, out: _Out) -> int:
    from kitdispatch.run.sample_tests import format_table, verify

    def build_sample(sample: Path, dest: Path) -> Path:
        from kitdispatch.builder.pipeline import BuildOptions, build

        options = BuildOptions.create(args.arch, compiler=args.compiler)
        return build(sample, options, dest, progress=out.progress).record

    report = verify(args.paths, build_module=build_sample, device=args.device, log=out.detail)
    if not out.as_json:
        out.info(f"device: {report.device}")
    out.result(report.to_json(), format_table(report) + "\n" + report.summary())
    if out.as_json:
        print(report.summary(), file=out.stderr)
    if not report.ok:
        return 1
    if report.checked_nothing:
        print(
            "kitdispatch test: nothing was checked: every function was skipped (see the table)",
            file=out.stderr,
        )
        return EXIT_NOTHING_CHECKED
    return 0


def _cmd_doctor(args: argparse.Namespace, out: _Out) -> int:
    from kitdispatch.doctor import collect, format_report

    report = collect()
    out.result(report, format_report(report))
    return 0


def _cmd_cache(args: argparse.Namespace, out: _Out) -> int:
    from kitdispatch.compile.cache import Cache

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


_COMMANDS = {"build": _cmd_build, "gen": _cmd_gen, "compare": _cmd_compare, "tune": _cmd_tune, "profile": _cmd_profile, "run": _cmd_run, "test": _cmd_test, "doctor": _cmd_doctor, "cache": _cmd_cache}
