"""Adapting a compiled kernel entry to what IREE passes it, so any kernel runs unmodified.

IREE's CUDA HAL launches an export with every binding (a pointer) first, then every push
constant, each constant a 32-bit value in a kernel parameter of its own (abi.py). A kernel
whose C signature is otherwise (an 8-byte scalar such as `long long`, `double`, `size_t`; a
struct passed by value; a scalar before a pointer) is bridged: its PTX `.entry` is rewritten
to take the pointers first, in C order, then each scalar as it is when it is 4 bytes or
narrower, or as 32-bit words (`.param .u32 NAME_w0, NAME_w1, ...`) when it is wider, and every
load of a split parameter is redirected to its words (an 8-byte load becomes two 32-bit loads
joined by `mov.b64 %d, {lo, hi}`). The body is otherwise untouched: the SASS is the
compiler's, only the parameter loads differ. The bridged PTX is then assembled to a cubin by
nvJitLink from pip (`nvidia-nvjitlink`, no CUDA toolkit; about 30 ms a kernel) for NVRTC
builds, or by the toolkit's ptxas for nvcc builds, and packed into a fatbin by nvFatbin.

Why the PTX and not a generated wrapper kernel that takes the halves and calls the user's
kernel as a `__device__` function: that needs the kernel's `__global__` turned into
`__device__`, and nvcc then refuses the kernel's own `__launch_bounds__` ("only allowed on a
__global__ function", measured with nvcc 13.0), as it refuses `__grid_constant__`; dropping
them would change the kernel's register allocation. Rewriting the entry keeps the user's
kernel exactly as compiled, works the same for NVRTC and nvcc and every object format, and
reorders parameters for free (the body names parameters, not positions).

A kernel that takes the address of a parameter that must be split (PTX `mov.u64 %rd,
k_param_3`) cannot be bridged: the error says so and suggests the `_lo`/`_hi` form.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kitdispatch._proc import run_tool
from kitdispatch._resources import installed_version
from kitdispatch._workers import POOL, map_in_threads
from kitdispatch.compile.archs import Arch, ptx_fallback_archs
from kitdispatch.compile.compilers import CompileOptions, Compiler, IncludeSearch, ObjectCode, check_archs, fatbin_note, pack_fatbin
from kitdispatch.compile.toolchain import find_nvrtc
from kitdispatch.errors import AbiError, CompileError, KitError
from kitdispatch.compile.ptx_text import ENTRY_RE, body_end_of
from kitdispatch.describe.kernel import Buffer, Kernel

ASSEMBLE_TIMEOUT_S = 300.0
_WORD = 4  # bytes of a push constant


def entry_bridge(kernel: Kernel) -> tuple[str, tuple[int, ...]]:
    """What the compile needs to bridge a kernel (CompileOptions.bridges): its name as the
    build knows it (a C name, or a C++ name expression resolved through the compile's lowered
    names) and the positions of its pointer parameters (IREE's bindings)."""
    pointers = tuple(i for i, s in enumerate(kernel.c_slots) if isinstance(s.param, Buffer))
    return kernel.symbol or kernel.name, pointers


# --------------------------------------------------------------------------- rewriting


@dataclass(frozen=True)
class _Param:
    decl: str  # the declaration as written: ".param .align 8 .b8 k_param_4[16]"
    name: str
    size: int


_PARAM_NAME_RE = re.compile(r"(?P<name>[\w$.]+)\s*(?:\[(?P<count>\d+)\])?\s*$")
_PARAM_TYPE_RE = re.compile(r"\.(?P<type>[usfb])(?P<bits>\d+)\b")
_LOAD_RE = re.compile(
    r"^(?P<indent>\s*)ld\.param(?P<vec>\.v[24])?\.(?P<type>[usfb])(?P<bits>\d+)\s+"
    r"(?P<dst>\{[^}]*\}|[%\w$.]+)\s*,\s*\[\s*(?P<name>[\w$.]+)\s*(?:\+\s*(?P<off>\d+))?\s*\]\s*;\s*$"
)


def rewrite_entry(ptx: str, entry: str, pointers: tuple[int, ...]) -> str:
    """`ptx` with `.entry entry` taking its pointers first and its wide scalars as words."""
    m = next((m for m in ENTRY_RE.finditer(ptx) if m.group("name") == entry), None)
    if m is None:
        raise AbiError(f"kernel entry {entry!r} is not in the compiled PTX", fix="check the kernel's name")
    params = [_param(d) for d in m.group("params").split(",") if d.strip()]
    if any(i >= len(params) for i in pointers):
        raise AbiError(f"kernel {entry!r} has {len(params)} parameters, fewer than the manifest declares", fix="declare every C parameter")
    order = [params[i] for i in pointers] + [p for i, p in enumerate(params) if i not in pointers]
    split = {p.name: p for i, p in enumerate(params) if i not in pointers and p.size > _WORD}
    decls = []
    for p in order:
        decls += [f".param .u32 {_word(p.name, w)}" for w in range(-(-p.size // _WORD))] if p.name in split else [p.decl]
    header = ",\n\t".join(decls)
    body_start = m.end()
    body_end = body_end_of(ptx, body_start - 1)
    body, temps = _rewrite_loads(ptx[body_start:body_end], split, entry)
    declare = f"\n\t.reg .b32 \t%kdw<{temps}>;" if temps else ""
    head = ptx[m.start() : m.start("params")] + "\n\t" + header + "\n)" + m.group("directives") + "{"
    before, after = _redeclared(ptx[: m.start()], entry, header), _redeclared(ptx[body_end:], entry, header)
    return before + head + declare + body + after


def _redeclared(ptx: str, entry: str, header: str) -> str:
    """`ptx` with the entry's declarations (nvcc writes one before a variable holding the
    kernel's address, e.g. the entries unit's) taking the rewritten parameters: ptxas
    refuses a declaration that differs from the definition."""
    declaration = re.compile(rf"(\.entry\s+{re.escape(entry)}\s*\()[^)]*(\)\s*;)")
    return declaration.sub(lambda d: d.group(1) + "\n\t" + header + "\n" + d.group(2), ptx)


def _param(decl: str) -> _Param:
    decl = decl.strip()
    name = _PARAM_NAME_RE.search(decl)
    kind = _PARAM_TYPE_RE.search(decl)
    if name is None or kind is None:
        raise AbiError(f"cannot read the PTX parameter {decl!r}", fix="report this kernel to kitdispatch")
    return _Param(decl, name.group("name"), int(kind.group("bits")) // 8 * int(name.group("count") or 1))


def _word(name: str, index: int) -> str:
    return f"{name}_w{index}"


def _rewrite_loads(body: str, split: dict[str, _Param], entry: str) -> tuple[str, int]:
    """Every load of a split parameter, redirected to its words; (new body, temps used)."""
    if not split:
        return body, 0
    mention = re.compile(r"(?<![\w$.])(" + "|".join(re.escape(n) for n in split) + r")(?![\w$.])")
    lines, temps = [], 0
    for line in body.split("\n"):
        if not mention.search(line):
            lines.append(line)
            continue
        m = _LOAD_RE.match(line)
        if m is None or m.group("name") not in split:
            raise AbiError(
                f"kernel {entry!r} uses parameter {mention.search(line).group(1)} other than by loading it "
                f"(PTX: {line.strip()!r}), so it cannot be split into 32-bit push constants",
                fix="take the value as two 32-bit parameters NAME_lo, NAME_hi (declared i64, u64 or f64), "
                "or copy the parameter to a local variable before taking its address",
            )
        new, temps = _split_load(m, temps, entry)
        lines.append(new)
    return "\n".join(lines), temps


def _split_load(m: re.Match, temps: int, entry: str) -> tuple[str, int]:
    indent, name, size = m.group("indent"), m.group("name"), int(m.group("bits")) // 8
    kind = f"{m.group('type')}{m.group('bits')}"
    dsts = [d.strip() for d in m.group("dst").strip("{}").split(",")]
    base = int(m.group("off") or 0)
    out = []
    for k, dst in enumerate(dsts):
        offset = base + k * size
        if dst == "_":
            continue
        if size <= _WORD and offset % _WORD + size <= _WORD:
            within = offset % _WORD
            out.append(f"ld.param.{kind} \t{dst}, [{_word(name, offset // _WORD)}{f'+{within}' if within else ''}];")
        elif size == 2 * _WORD and offset % _WORD == 0:
            lo, hi = f"%kdw{temps}", f"%kdw{temps + 1}"
            temps += 2
            out += [
                f"ld.param.u32 \t{lo}, [{_word(name, offset // _WORD)}];",
                f"ld.param.u32 \t{hi}, [{_word(name, offset // _WORD + 1)}];",
                f"mov.b64 \t{dst}, {{{lo}, {hi}}};",
            ]
        else:
            raise AbiError(
                f"kernel {entry!r} loads {size} bytes at offset {offset} of parameter {name}, across two "
                "32-bit push constants",
                fix="pass the value in a struct whose members are 4-byte aligned, or as separate parameters",
            )
    return indent + ("\n" + indent).join(out), temps


# -------------------------------------------------------------------------- assembling


def assemble(ptx: bytes, arch: Arch, compiler: str, *, nvcc: str | None = None, timeout: float = ASSEMBLE_TIMEOUT_S) -> tuple[bytes, str]:
    """A cubin for `arch` from PTX: nvJitLink from pip for NVRTC builds, the toolkit's ptxas
    (beside nvcc) for nvcc builds. Returns (cubin, the assembler's log)."""
    if compiler == "nvcc":
        return _ptxas(ptx, arch, nvcc, timeout)
    return _nvjitlink(ptx, arch, timeout)


def assemble_command(arch: Arch, compiler: str, nvcc: str | None) -> str:
    """The assembler's command, as -v shows it (nvJitLink is a library: its equivalent)."""
    tool = "ptxas" if compiler == "nvcc" else "# nvJitLink (the library), as: ptxas"
    return f"{tool} -arch={arch.name} -O3 bridged.ptx -o bridged.cubin"


def assembler_version(compiler: str) -> tuple[str, str]:
    """The (package, version) of the assembler, for cache keys: nvcc's ptxas is nvcc's."""
    if compiler == "nvcc":
        return ("ptxas", "nvcc")
    return ("nvidia-nvjitlink", installed_version("nvidia-nvjitlink", "nvidia") or "none")


def _nvjitlink(ptx: bytes, arch: Arch, timeout: float) -> tuple[bytes, str]:
    try:
        import cuda.bindings.nvjitlink  # noqa: F401
    except ImportError as exc:
        raise KitError(f"nvJitLink is not available: {exc}", fix="pip install 'nvidia-nvjitlink>=13.0,<13.1'") from None
    _check_same_cuda_major()
    request = {"ptx": ptx.rstrip(b"\0") + b"\0", "options": [f"-arch={arch.name}", "-O3"]}
    reply = POOL.call("nvjitlink_cubin", request, timeout=timeout, what=f"nvJitLink assembling PTX for {arch.name}")
    if not reply["ok"]:
        raise CompileError(
            f"nvJitLink could not assemble the bridged PTX for {arch.name}",
            log=reply["log"],
            fix="pip install 'nvidia-nvjitlink>=13.0,<13.1' (a version that reads the PTX NVRTC emits)",
        )
    return reply["cubin"], reply["log"]


def _check_same_cuda_major() -> None:
    """nvJitLink's cubins need a driver of its CUDA major: a CUDA 12 (cu12) NVRTC build must
    not get CUDA 13 cubins it cannot load."""
    nvrtc, linker = find_nvrtc(), assembler_version("nvrtc")[1]
    if linker == "none":
        raise KitError(
            "a bridged kernel (bridge.py) needs nvJitLink to assemble its PTX, and it is not installed",
            fix="pip install 'nvidia-nvjitlink>=13.0,<13.1' (in kitdispatch's build extra), or build with --format ptx",
        )
    if nvrtc is not None and linker.split(".")[0] != str(nvrtc.cuda_major):
        raise KitError(
            f"a bridged kernel (bridge.py) is assembled by nvJitLink {linker}, whose cubins need a CUDA "
            f"{linker.split('.')[0]} driver, but this build uses CUDA {nvrtc.cuda_major}'s NVRTC ({nvrtc.origin})",
            fix="build with --format ptx (the driver compiles the bridged PTX), or --compiler nvcc (its own ptxas), or "
            "install nvJitLink of the same CUDA major",
        )


def _ptxas(ptx: bytes, arch: Arch, nvcc: str | None, timeout: float) -> tuple[bytes, str]:
    ptxas = str(Path(nvcc).with_name("ptxas")) if nvcc and Path(nvcc).with_name("ptxas").is_file() else shutil.which("ptxas")
    if ptxas is None:
        raise KitError("ptxas is not beside nvcc nor on PATH", fix="install the CUDA toolkit's ptxas, or use --compiler nvrtc")
    with tempfile.TemporaryDirectory(prefix="kitdispatch-ptxas-") as tmp:
        src, out = Path(tmp) / "bridged.ptx", Path(tmp) / "bridged.cubin"
        src.write_bytes(ptx.rstrip(b"\0"))
        argv = [ptxas, f"-arch={arch.name}", "-O3", str(src), "-o", str(out)]
        res = run_tool(argv, timeout=timeout)
        if res.returncode != 0:
            raise CompileError(f"ptxas could not assemble the bridged PTX for {arch.name}", argv=argv, returncode=res.returncode, log=res.stderr + res.stdout, fix="report this kernel to kitdispatch")
        return out.read_bytes(), (res.stderr + res.stdout).strip()


# --------------------------------------------------------------------------- compiling


class BridgingCompiler:
    """A compiler whose objects have the entries named in `options.bridges` rewritten.
    Without bridges it is the compiler it wraps. With them, each architecture compiles to
    PTX, the entries are rewritten, and cubins and fatbins are assembled from that PTX. An
    object's `ptx` stays the compiler's own (the build checks the layout against it)."""

    def __init__(self, inner: Compiler) -> None:
        self.inner = inner
        self.name = inner.name

    def version(self) -> str:
        return self.inner.version()

    def supported_archs(self) -> tuple[Arch, ...]:
        return self.inner.supported_archs()

    def include_search(self, source: Path, options: CompileOptions) -> IncludeSearch:
        search = self.inner.include_search(source, options)
        if not options.bridges:
            return search
        return dataclasses.replace(search, header_versions=search.header_versions + (assembler_version(self.name),))

    def compile(self, source: Path, arch: Arch, fmt: str, options: CompileOptions) -> ObjectCode:
        if not options.bridges:
            return self.inner.compile(source, arch, fmt, options)
        plain, bridged = self._bridged(source, arch, options)
        if fmt == "ptx":
            return dataclasses.replace(plain, data=bridged)
        return self._assembled(plain, bridged)

    def compile_fatbin(self, source: Path, archs: tuple[Arch, ...], options: CompileOptions) -> ObjectCode:
        if not options.bridges:
            return self.inner.compile_fatbin(source, archs, options)
        check_archs(self.inner, archs)
        pairs = dict(zip(archs, map_in_threads(lambda arch: self._bridged(source, arch, options), archs)))
        cubins = map_in_threads(lambda arch: self._assembled(*pairs[arch]), archs)
        # nvFatbin packs each object's `ptx`: the bridged PTX here, not the compiler's.
        data = pack_fatbin(
            [dataclasses.replace(c, ptx=pairs[c.arch][1]) for c in cubins],
            [dataclasses.replace(pairs[a][0], ptx=pairs[a][1]) for a in ptx_fallback_archs(archs)],
        )
        notes = tuple(dict.fromkeys(n for c in cubins for n in c.diagnostics))
        commands = tuple(c for cubin in cubins for c in cubin.commands) + (fatbin_note(cubins, [pairs[a][0] for a in ptx_fallback_archs(archs)]),)
        return ObjectCode.from_fatbin(data, tuple(archs), source, self.name, ptx=cubins[-1].ptx, lowered=cubins[0].lowered, diagnostics=notes, commands=commands)

    def _bridged(self, source: Path, arch: Arch, options: CompileOptions) -> tuple[ObjectCode, bytes]:
        """The compiler's PTX object for `arch`, and its PTX with the entries rewritten."""
        plain = self.inner.compile(source, arch, "ptx", dataclasses.replace(options, bridges=()))
        text, lowered = plain.ptx.decode(), dict(plain.lowered)
        for name, pointers in options.bridges:
            text = rewrite_entry(text, lowered.get(name, name), pointers)
        return plain, text.encode()

    def _assembled(self, plain: ObjectCode, bridged: bytes) -> ObjectCode:
        timeout = getattr(self.inner, "timeout", ASSEMBLE_TIMEOUT_S)
        cubin, log = assemble(bridged, plain.arch, self.name, nvcc=getattr(self.inner, "path", None), timeout=timeout)
        notes = plain.diagnostics + ((log,) if log else ())
        commands = plain.commands + (assemble_command(plain.arch, self.name, getattr(self.inner, "path", None)),)
        return ObjectCode.from_cubin(cubin, plain.arch, plain.source, self.name, ptx=plain.ptx, lowered=plain.lowered, diagnostics=notes, commands=commands)
