"""Rendering IREE MLIR from kernel descriptions and compiled objects.

All decisions (layouts, ordinals, variant order, operand order, which outputs need a
tied `flow.tensor.alloca`) are made here in Python; the jinja2 templates in `mlir_templates/`
only substitute the names and types computed below.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jinja2

from kitdispatch._version import __version__
from kitdispatch._resources import data_dir
from kitdispatch.compile.archs import Arch
from kitdispatch.errors import ManifestError
from kitdispatch.describe import abi
from kitdispatch.emit.index_ops import IndexOps
from kitdispatch.emit.syntax import Spelling
from kitdispatch.emit.mlir_text import mlir_comment, mlir_string, mlir_symbol
from kitdispatch.describe.kernel import Buffer, Kernel, Param, Scalar
from kitdispatch.describe.index_expr import IndexExpr
from kitdispatch.describe.module import ModuleSpec
from kitdispatch.describe.types import ScalarType, TensorType
from kitdispatch.describe.names import ASYNC_SUFFIX, RECORDING_SUFFIX, as_identifier, distinct_names


@dataclass(frozen=True)
class VariantObject:
    """One object file and the architecture it serves."""

    arch: Arch
    format: str  # ptx, cubin or fatbin
    path: str

    @property
    def capability_range(self) -> tuple[int, int]:
        """[min, max) compute capabilities this object runs on.

        PTX JIT-compiles forward to any newer GPU; SASS (cubin) runs only within its
        major version; arch-specific code (sm_90a) only on that exact architecture.
        """
        cap = self.arch.capability
        if self.arch.suffix == "a":
            return cap, cap + 1
        if self.format == "cubin" or self.arch.suffix == "f":
            return cap, (self.arch.major + 1) * 10
        return cap, NO_UPPER_BOUND


NO_UPPER_BOUND = 2**31 - 1


@dataclass(frozen=True)
class ExecutableObjects:
    """The objects of one source file in one format, in the order variants are tried."""

    source: Path
    format: str
    objects: tuple[VariantObject, ...]


@dataclass(frozen=True)
class RenderedModule:
    text: str
    executables: tuple[str, ...]
    functions: tuple[str, ...]


def executable_name(stem: str, fmt: str | None = None) -> str:
    """An MLIR symbol for a source's executable, from its unique stem (ModuleSpec.source_stem)."""
    stem = as_identifier(stem, fallback="kernels", digit_prefix="k")
    return f"{stem}_{fmt}_executable" if fmt else f"{stem}_executable"


def render_module(
    spec: ModuleSpec,
    objects: Sequence[ExecutableObjects],
    *,
    programs: Sequence[tuple[str, str]] = (),
    archs: Sequence[Arch] = (),
    template_cache: Path | None = None,
    spelling: Spelling,
) -> RenderedModule:
    """`programs` are (origin, MLIR text) pairs of the user's own functions to append; `archs`
    the build's architectures, for the header.
    `template_cache` keeps the compiled templates between processes (jinja2 bytecode).
    `spelling` is how the target IREE release writes what the MLIR holds (IreeRelease.spelling)."""
    by_key = {(o.source, o.format): o for o in objects}
    groups = _group_kernels(spec.kernels)
    names = _executable_names(spec, groups, _program_symbols(spec, programs))
    executables, functions, records = [], [], []
    for (source, fmt), kernels in groups.items():
        _check_distinct_entries(source, kernels)
        exe = _executable_view(names[(source, fmt)], kernels, by_key[(source, fmt)], spelling)
        executables.append(exe)
        for kernel in kernels:
            view = _function_view(kernel, exe, spelling)
            if view["result_count"]:
                functions += [view, _async_variant(view)]
                records.append(view)
            else:
                functions.append(view)
    archs = sorted(set(archs) or {v.arch for o in objects for v in o.objects}, reverse=True)
    text = _environment(template_cache).get_template("module.mlir.j2").render(
        version=__version__,
        origin=mlir_comment(spec.name),
        archs=", ".join(a.name for a in archs),
        executables=executables,
        functions=functions,
        records=records,
        programs=[{"origin": mlir_comment(o), "text": t.strip("\n")} for o, t in programs],
    )
    return RenderedModule(
        text, tuple(e["name"] for e in executables), tuple(f["name"] for f in functions if f["op"] == "func.func")
    )


def _executable_names(spec: ModuleSpec, groups: dict[tuple[Path, str], list[Kernel]], defined: set[str]) -> dict[tuple[Path, str], str]:
    """Each executable's symbol: from its source's unique stem (and its format, where a source
    has several), made distinct where sanitising makes two alike (`my-k.cu`, `my_k.cu`) or
    one alike a function's or a program's symbol (all share the module's symbol table)."""
    sources = [source for source, _ in groups]
    wanted = {(s, f): executable_name(spec.source_stem(s), f if sources.count(s) > 1 else None) for s, f in groups}
    taken = defined | {sig.name for sig in spec.signatures} | set(_generated_functions(spec))
    salts = {(s, f): f"{s}\0{f}" for s, f in groups}
    return distinct_names(wanted, salts, join="_", taken=taken, what="executable names")


def _generated_functions(spec: ModuleSpec) -> dict[str, Kernel]:
    """Every function the kit generates, by name: NAME, NAME$async and NAME$record."""
    return {f"{k.function}{suffix}": k for k in spec.kernels for suffix in ("", ASYNC_SUFFIX, RECORDING_SUFFIX)}


# A top-level symbol a program defines: `func.func @f(`, `util.global private @g`, ...
_DEFINITION_RE = re.compile(
    r"^\s*(?:func\.func|util\.func|util\.global|ml_program\.global|memref\.global|hal\.executable(?:\.source)?|flow\.executable|stream\.executable)"
    r"\s+(?:(?:public|private|nested)\s+)*@([A-Za-z_][\w$.]*)",
    re.M,
)


def _program_symbols(spec: ModuleSpec, programs: Sequence[tuple[str, str]]) -> set[str]:
    """The symbols the programs define; a function the kit generates too is refused here
    rather than by iree-compile as a redefinition."""
    generated = _generated_functions(spec)
    defined: set[str] = set()
    for origin, text in programs:
        _check_program_text(origin, text)
        for m in _DEFINITION_RE.finditer(text):
            name = m.group(1)
            if name in generated:
                line = text.count("\n", 0, m.start(1)) + 1
                raise ManifestError(
                    f"the program defines @{name}, which kitdispatch generates for kernel {generated[name].name!r}",
                    where=f"{origin}:{line}",
                    fix="rename the program's symbol, or give the kernel another `function` name",
                )
            defined.add(name)
    return defined


def _check_distinct_entries(source: Path, kernels: list[Kernel]) -> None:
    """One executable exports each entry once; IREE names the export after the object's entry."""
    first: dict[str, Kernel] = {}
    for k in kernels:
        if k.entry in first:
            raise ManifestError(
                f"kernels {first[k.entry].name!r} and {k.name!r} of {source} are both the entry {k.entry!r}",
                where=str(source),
                fix="describe the kernel once; for a second launch of one entry, give it a wrapper kernel of its own",
            )
        first[k.entry] = k


class _BytecodeCache(jinja2.FileSystemBytecodeCache):
    """jinja2's file cache of compiled templates, where a write that fails (a full disk, or
    `kitdispatch cache clear` removing the folder meanwhile) only loses the speed-up."""

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            Path(self.directory).mkdir(mode=0o700, parents=True, exist_ok=True)
            super().dump_bytecode(bucket)
        except OSError:
            pass


@functools.cache
def _environment(template_cache: Path | None = None) -> jinja2.Environment:
    # Compiling the templates takes ~25 ms a process: most of a build with nothing new to do.
    bytecode = _BytecodeCache(str(template_cache)) if template_cache else None
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("mlir_templates"))),
        bytecode_cache=bytecode,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _group_kernels(kernels: Sequence[Kernel]) -> dict[tuple[Path, str], list[Kernel]]:
    """One executable per source file and object format (formats are resolved by the build)."""
    groups: dict[tuple[Path, str], list[Kernel]] = {}
    for k in kernels:
        groups.setdefault((k.source, k.format or "ptx"), []).append(k)
    return groups


# ------------------------------------------------------------------------- executables


GENERIC_FORMAT = "cuda-nvptx-fb"
# The variant IREE makes of a hal.executable.source for the generic target: its format, in a symbol.
GENERIC_VARIANT = GENERIC_FORMAT.replace("-", "_")


def _executable_view(name: str, kernels: list[Kernel], objects: ExecutableObjects, spelling: Spelling) -> dict:
    variants = [
        {
            "name": f"{v.arch.name}_{v.format}",
            "arch": v.arch.name,
            "min_capability": v.capability_range[0],
            "max_capability": v.capability_range[1],
            "object_path": mlir_string(v.path),
            # Each variant's exports reserve its architecture's dynamic shared memory.
            "exports": [_export_view(k, i, spelling, v.arch.name) for i, k in enumerate(kernels)],
        }
        for v in objects.objects
    ]
    # One object (one PTX, or a fatbin where the driver picks the code) serves every device
    # through the generic target. Several objects need explicit variants with device
    # conditions: an objects map with several targets always runs the first one listed,
    # whatever the GPU (README, "How the generated MLIR is chosen").
    template = "executable_source.mlir.j2" if len(variants) == 1 else "executable_variants.mlir.j2"
    # One object keyed by the generic CUDA target, which matches any CUDA device target.
    generic_target = f'#hal.executable.target<"cuda", "{GENERIC_FORMAT}">'
    first_object = f'#hal.executable.object<{{path = {variants[0]["object_path"]}}}>'
    objects_map = f"#hal.executable.objects<{{\n    {generic_target} = [{first_object}]\n}}>"
    return {
        "name": name,
        "template": template,
        "variants": variants,
        "objects": spelling.inherent({"objects": objects_map}),
        "exports": variants[0]["exports"],  # one object: its exports are the executable's
    }


def _export_view(kernel: Kernel, ordinal: int, spelling: Spelling, arch: str) -> dict:
    """The export of `kernel` in an object compiled for `arch`."""
    workload = kernel.workload
    # The region's values: `%device`, then the workload (a size may be named `device` or `count_x`).
    names = _SsaNames()
    workload_ssa = [names.take(s) for s in workload]
    index = IndexOps(names.take, dict(zip(workload, workload_ssa)), checked=False)
    count = [
        index.value(e, names.take(f"count_{axis}"), symbols=workload)
        for axis, e in zip("xyz", kernel.workgroup_count)
    ]
    return {
        "doc": mlir_comment(f"{kernel.name}: {_describe_params(kernel)}"),
        "symbol": mlir_symbol(kernel.entry),
        "ordinal": ordinal,
        # One per push constant: 64-bit scalars take two (abi.AbiType.words).
        "constants": sum(s.words for s in kernel.scalars),
        # IREE binds tensor operands in operand order, then untied results; the function
        # keeps every buffer's C slot (see `_needs_storage_operand`), so bindings follow the C order.
        "bindings": ["" if not b.read_only else ", ReadOnly" for b in kernel.buffers],
        "workload": workload_ssa,
        "count": count,
        "count_ops": index.ops,
        # Dynamic shared memory travels as the export's workgroup_local_memory attribute: the
        # bytes every launch gets (with an expression, the most a call may need; each call
        # checks its own need against it, `_shared_memory_check`).
        "attributes": spelling.inherent(
            {"workgroup_size": "[" + ", ".join(f"{n} : index" for n in kernel.workgroup_size) + "]"},
            {"workgroup_local_memory": shared} if (shared := kernel.shared_memory_for(arch)) else {},
        ),
    }


def _shared_memory_check(kernel: Kernel, index: IndexOps) -> None:
    """A call whose dynamic shared memory need (an expression over its sizes) exceeds what
    each launch reserves fails before the dispatch, naming the kernel, the expression, its
    sizes and the limit: IREE launches every call with the export's fixed size."""
    need = kernel.dynamic_shared_memory_need
    if need is None:
        return
    what = f"{kernel.name}: dynamic_shared_memory '{need}'"
    index.check_divisors(need, what)
    value = index.value(need, index.take("shared_memory"), what=what)
    sizes = ", ".join(need.symbols)
    index.check_at_most(
        value,
        kernel.dynamic_shared_memory,
        f"kernel {kernel.name}: dynamic_shared_memory = {need} bytes for this call's {sizes} is more than the "
        f"{kernel.dynamic_shared_memory} bytes each launch reserves (dynamic_shared_memory_max); raise "
        f"dynamic_shared_memory_max (up to the GPU's opt-in limit per block: 227 KiB on sm_90 and sm_100, "
        f"163 KiB on sm_80, 99 KiB on sm_86, sm_89 and sm_120) or call with smaller sizes",
    )


def _describe_params(kernel: Kernel) -> str:
    parts = [
        f"{p.access} {p.name}: {p.type}" if isinstance(p, Buffer) else f"{p.dtype} {p.name}"
        for p in kernel.params
    ]
    return ", ".join(parts)



def _needs_storage_operand(kernel: Kernel, buffer: Buffer) -> bool:
    """An 'out' buffer before some input must be a (tied) operand to keep its binding slot.
    That operand is a `flow.tensor.alloca` of its own: IREE's flow stage folds identical
    `tensor.empty`s into one value, so two same-shape results would share one buffer
    (llm.c's layernorm got rstd in both mean and rstd). An alloca has an allocation effect,
    so IREE 3.10 to 3.13 keep each one and give each its own range of the result buffer."""
    if buffer.access != "out":
        return False
    later = kernel.buffers[kernel.buffers.index(buffer) + 1 :]
    return any(b.is_argument for b in later)


# --------------------------------------------------------------------------- functions


def _function_view(kernel: Kernel, exe: dict, spelling: Spelling) -> dict:
    ssa = _SsaNames()
    args = kernel.function_arguments
    arg_ssa = {p.name: ssa.take(p.name) for p in args}
    arg_types = {p.name: p.type.mlir if isinstance(p, Buffer) else ScalarType(p.dtype).mlir for p in args}
    # A struct is one argument per 32-bit word (abi.AbiType.arguments).
    words = {p.name: [ssa.take(f"{p.name}_w{i}") for i in range(p.words)] for p in args if isinstance(p, Scalar) and p.abi.kind == "struct"}

    # Symbol values (index): dimensions of tensor arguments, then integer scalar arguments.
    symbol_ssa: dict[str, str] = {}
    index_constants: dict[int, str] = {}
    dims, symbol_casts = [], []
    for b in kernel.buffers:
        if not b.is_argument:
            continue
        for axis, dim in enumerate(b.type.shape):
            if isinstance(dim, str) and dim not in symbol_ssa:
                if axis not in index_constants:
                    index_constants[axis] = ssa.take(f"c{axis}")
                symbol_ssa[dim] = ssa.take(f"dim_{dim}")
                dims.append(
                    {
                        "ssa": symbol_ssa[dim],
                        "tensor": arg_ssa[b.name],
                        "index_ssa": index_constants[axis],
                        "axis": axis,
                        "tensor_type": b.type.mlir,
                    }
                )
    for s in kernel.scalars:
        if kernel.is_function_argument(s) and s.name in kernel.known_symbols and s.name not in symbol_ssa:
            symbol_ssa[s.name] = ssa.take(f"dim_{s.name}")
            op = "arith.index_castui" if s.abi.kind == "uint" else "arith.index_cast"
            symbol_casts.append(_op(symbol_ssa[s.name], op, f"%{arg_ssa[s.name]}", f"{arg_types[s.name]} to index"))

    # Push constant values, in C order: one i32 per constant (two for 64-bit scalars).
    constants = _Constants(ssa)
    index = IndexOps(ssa.take, symbol_ssa, checked=True)
    for axis, e in zip("xyz", kernel.workgroup_count):
        index.check_divisors(e, f"{kernel.name}: workgroup_count {axis} '{e}'")
    _shared_memory_check(kernel, index)
    for s in kernel.scalars:
        value = s.value if s.value is not None or kernel.is_function_argument(s) else IndexExpr.parse(s.name, "")
        if isinstance(value, IndexExpr):
            idx = index.value(value, ssa.take(f"{s.name}_index"), what=f"{kernel.name}: the value of {s.name} '{value}'")
            constants.from_index(s, idx)
        elif isinstance(value, float):
            constants.from_literal(s, value)
        elif s.name in words:
            constants.values += words[s.name]
        else:
            constants.from_argument(s, arg_ssa[s.name])

    def shaped(t: TensorType) -> str:
        dyn = [f"%{symbol_ssa[d]}" for d in t.shape if isinstance(d, str)]
        return f"{t.mlir}{{{', '.join(dyn)}}}" if dyn else t.mlir

    def tied(name: str, t: TensorType) -> str:
        """A result tied to operand `%name`; its dims in braces where it has dynamic ones."""
        dyn = [f"%{symbol_ssa[d]}" for d in t.shape if isinstance(d, str)]
        return f"%{name}{{{', '.join(dyn)}}}" if dyn else f"%{name}"

    # Tensor operands and results, keeping every buffer's binding slot.
    allocas, operands, operand_types, results = [], [], [], []
    for b in kernel.buffers:
        if b.is_argument or _needs_storage_operand(kernel, b):
            name = arg_ssa[b.name] if b.is_argument else ssa.take(f"{b.name}_alloca")
            if not b.is_argument:
                allocas.append({"ssa": name, "type": shaped(b.type)})
            operands.append(f"%{name}")
            operand_types.append(shaped(b.type))
            if b.is_result:
                results.append(tied(name, b.type))
        else:
            results.append(shaped(b.type))

    result_buffers = [b for b in kernel.buffers if b.is_result]
    targets = [f"{mlir_symbol(exe['name'])}::{mlir_symbol(kernel.entry)}"]
    if exe["template"] == "executable_variants.mlir.j2":
        targets = [f"{mlir_symbol(exe['name'])}::{mlir_symbol(v['name'])}::{mlir_symbol(kernel.entry)}" for v in exe["variants"]]
    outputs = [(i, ssa.take(f"{b.name}_storage"), b) for i, b in enumerate(result_buffers) if b.access == "out"]

    def declare(p: Param, tensor_type: str) -> str:
        """`p`'s function argument(s); a tensor's of type `tensor_type`."""
        if p.name in words:
            return ", ".join(f"%{w}: i32" for w in words[p.name])
        return f"%{arg_ssa[p.name]}: {tensor_type if isinstance(p, Buffer) else arg_types[p.name]}"

    workload = ", ".join(f"%{symbol_ssa[w]}" for w in kernel.workload)
    return {
        "doc": mlir_comment(f"{kernel.function}: dispatches {kernel.name} ({_describe_params(kernel)})"),
        "op": "func.func",
        "name": kernel.function,
        "args": ", ".join(declare(p, arg_types.get(p.name)) for p in args),
        "attributes": "",
        "return_op": "return",
        "outputs": [(i, f"%{name}: {b.type.mlir}") for i, name, b in outputs],
        "index_constants": [{"ssa": v, "value": k} for k, v in index_constants.items()],
        "dims": dims,
        "symbol_casts": symbol_casts,
        "applies": index.ops,
        "constant_ops": constants.ops,
        "allocas": allocas,
        "target": targets[0] if len(targets) == 1 else "{" + ", ".join(targets) + "}",
        "workload": workload,
        "operands": ", ".join([f"%{c}" for c in constants.values] + operands),
        "operand_types": ", ".join(["i32"] * len(constants.values) + operand_types),
        "dispatch_results": ", ".join(results),
        "result_count": len(result_buffers),
        "returns": ", ".join(f"%result#{i}" for i in range(len(result_buffers))),
        "result_types": ", ".join(b.type.mlir for b in result_buffers),
        "record": _record_view(
            kernel, exe, spelling, ssa, [declare(p, "!hal.buffer_view") for p in args], arg_ssa, {b.name: n for _, n, b in outputs}, constants.values, workload
        ),
    }


# The device IREE creates for --iree-hal-target-device (one device: the kit builds for one).
TARGET_DEVICE = "@__device_0"


def _record_view(
    kernel: Kernel, exe: dict, spelling: Spelling, ssa: "_SsaNames", args: list[str], arg_ssa: dict, storage_ssa: dict, constants: list, workload: str
) -> dict:
    """`NAME$record`: records NAME's dispatch on given buffer views into a reusable command
    buffer and returns it, for calls repeated on the same arrays (runtime.PreparedCall submits
    it again without running the VM). Its arguments are NAME$async's, tensors as buffer views,
    without the fences. Bindings follow the C order, as the export's layout does, each over its
    whole buffer; the workgroup count comes from the export's own count region."""
    names = {k: ssa.take(k) for k in ("zero", "any_queue", "target_device", "workgroups", "executable", "entry", "commands")}
    view_of = {b.name: arg_ssa[b.name] if b.is_argument else storage_ssa[b.name] for b in kernel.buffers}
    bindings = [
        {"view": view_of[b.name], "buffer": ssa.take(f"{b.name}_buffer"), "length": ssa.take(f"{b.name}_length")}
        for b in kernel.buffers
    ]
    variant = exe["variants"][0]["name"] if len(exe["variants"]) > 1 else GENERIC_VARIANT
    target = f"{mlir_symbol(exe['name'])}::{mlir_symbol(variant)}::{mlir_symbol(kernel.entry)}"
    return {
        **names,
        "name": kernel.function + RECORDING_SUFFIX,
        "doc": f"{kernel.function}{RECORDING_SUFFIX}: {kernel.function}'s dispatch on these buffers, recorded once, submitted again by the runtime",
        "args": ", ".join(a for a in (*args, *(f"%{storage_ssa[b.name]}: !hal.buffer_view" for b in kernel.buffers if b.name in storage_ssa)) if a),
        "device": TARGET_DEVICE,
        "bindings": bindings,
        "target": target,
        "executable_symbol": exe["name"],
        "workload": f" workload([{workload}])" if workload else "",
        "entry_op": spelling.entry_point(names["entry"], names["executable"], target),
        "constants": f" constants([{', '.join(f'%{c}' for c in constants)}])" if constants else "",
    }


def _async_variant(view: dict) -> dict:
    """`NAME$async`: the same dispatch with IREE's coarse-fences ABI (a wait and a signal fence
    after the arguments) writing each `out` result into a caller-given buffer (`iree.abi.output`),
    so a call allocates nothing and does not block; kitdispatch's runtime calls this one. An
    `inout` result is its argument's buffer, updated in place (as NAME does: IREE 3.13 dispatches
    a tied argument in place; giving it storage too adds an allocation and two copies).
    A `util.func`, as converting a `func.func` drops the `iree.abi.model` attribute (IREE 3.13)."""
    outputs = [f"{arg} {{iree.abi.output = {i} : index}}" for i, arg in view["outputs"]]
    return {
        **view,
        "doc": f"{view['name']}{ASYNC_SUFFIX}: {view['name']} into given outputs, ordered by fences",
        "op": "util.func public",
        "name": view["name"] + ASYNC_SUFFIX,
        "args": ", ".join(a for a in (view["args"], *outputs) if a),
        "attributes": ' attributes {iree.abi.model = "coarse-fences"}',
        "return_op": "util.return",
    }


def _op(ssa: str, op: str, operands: str, types: str) -> dict:
    """One `%ssa = op operands : types` line of the generated function."""
    return {"ssa": ssa, "op": op, "operands": operands, "types": types}


class _Constants:
    """Turns each scalar into its i32 push constants, in order (abi.py): one for types of
    32 bits or fewer (the kernel reads the low bytes), two (low word first) for 64-bit ones."""

    def __init__(self, ssa: "_SsaNames") -> None:
        self.ssa = ssa
        self.ops: list[dict] = []
        self.values: list[str] = []
        self._c32: str | None = None

    def from_argument(self, s: Scalar, arg: str) -> None:
        """From the generated function's argument, of type abi.AbiType.argument."""
        kind = s.abi.argument
        if kind == "i32":  # 32-bit and narrower integers, and the bits of f16, bf16, fp8
            self.values.append(arg)
        elif kind == "f32":
            self.values.append(self._emit(f"{s.name}_bits", "arith.bitcast", f"%{arg}", "f32 to i32"))
        elif kind == "i1":
            self.values.append(self._emit(f"{s.name}_i32", "arith.extui", f"%{arg}", "i1 to i32"))
        else:  # i64, u64, and f64 as its bits
            self._split(s.name, arg)

    def from_index(self, s: Scalar, idx: str) -> None:
        if s.words == 2:
            self._split(s.name, self._emit(f"{s.name}_i64", "arith.index_cast", f"%{idx}", "index to i64"))
        else:
            self.values.append(self._emit(f"{s.name}_i32", "arith.index_cast", f"%{idx}", "index to i32"))

    def from_literal(self, s: Scalar, value: float) -> None:
        """Float literals become their bits here: IREE would demote an f64 constant to f32."""
        words = abi.words(s.abi, abi.bits(s.abi, value))
        for half, word in zip(("_lo", "_hi") if len(words) == 2 else ("",), words):
            self.values.append(self._emit(f"{s.name}{half}_bits", "arith.constant", str(word), "i32"))

    def _split(self, name: str, value: str) -> None:
        if self._c32 is None:
            self._c32 = self._emit("c32_i64", "arith.constant", "32", "i64")
        lo = self._emit(f"{name}_lo", "arith.trunci", f"%{value}", "i64 to i32")
        shifted = self._emit(f"{name}_shifted", "arith.shrui", f"%{value}, %{self._c32}", "i64")
        hi = self._emit(f"{name}_hi", "arith.trunci", f"%{shifted}", "i64 to i32")
        self.values += [lo, hi]

    def _emit(self, stem: str, op: str, operands: str, types: str) -> str:
        name = self.ssa.take(stem)
        self.ops.append(_op(name, op, operands, types))
        return name


class _SsaNames:
    """Hands out unique SSA names derived from readable stems."""

    def __init__(self) -> None:
        self._taken: set[str] = {"device", "result"}

    def take(self, stem: str) -> str:
        name, n = stem, 1
        while name in self._taken:
            n += 1
            name = f"{stem}_{n}"
        self._taken.add(name)
        return name


_MODULE_OP_RE = re.compile(r"^\s*(builtin\.)?module\b", re.M)


def _check_program_text(origin: str, text: str) -> None:
    m = _MODULE_OP_RE.search(text)
    if m:
        line = text.count("\n", 0, m.start()) + 1
        raise ManifestError(
            "a program file must hold top-level functions, not a `module` op",
            where=f"{origin}:{line}",
            fix="remove the `module { ... }` wrapper; kitdispatch puts your functions in the generated module",
        )


def render_template(name: str, **values: object) -> str:
    """Any template of mlir_templates/ in the kit's environment (StrictUndefined), for
    stages that render MLIR of their own (models/pipeline.py's transform spec)."""
    return _environment().get_template(name).render(**values)
