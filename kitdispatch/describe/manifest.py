"""The TOML manifest: the same kernel descriptions as the Python API, kept next to the kernels."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kitdispatch._files import FileTooLarge, NotRegularFile, read_regular_file
from kitdispatch.errors import ManifestError
from kitdispatch.describe.c_signature import KernelSignature, find_kernel
from kitdispatch.describe import abi
from kitdispatch.describe.kernel import Buffer, Kernel, Param, Replaces, Scalar, check_scalar_value
from kitdispatch.describe.types import FunctionSignature, TensorType, parse_value_type
from kitdispatch.describe.index_expr import IndexExpr
from kitdispatch.describe.module import ModuleSpec, Program, TestSpec, Tolerance, InputRange
from kitdispatch.describe.names import check_identifier, check_kernel_name, cpp_base_name
from kitdispatch.describe.reconcile import check_params, infer_params, with_split_halves


if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, as a package (kitdispatch depends on it there)
    import tomli as tomllib

MANIFEST_NAME = "kitdispatch.toml"

_TOP_KEYS = {"name": False, "kernels": True, "programs": False, "test": False, "include_dirs": False, "defines": False}
_KERNEL_KEYS = {
    "name": True,
    "source": True,
    "params": False,
    "shapes": False,
    "inout": False,
    "in": False,
    "out": False,
    "scalars": False,
    "values": False,
    "workgroup_size": True,
    "workgroup_count": True,
    "function": False,
    "format": False,
    "dynamic_shared_memory": False,
    "dynamic_shared_memory_max": False,
    "replaces": False,
    "replace_when": False,
    "include_dirs": False,
    "defines": False,
}
_REPLACE_WHEN_KEYS = {
    "multiple_of": False, "max": False, "dimension": False, "pattern": False, "mask": False, "epilogue": False, "when": False, "arithmetic": False,
}
_PROGRAM_KEYS = {"source": True, "functions": True}
_FUNCTION_KEYS = {"name": True, "args": True, "results": True}
_TEST_KEYS = {"reference": False, "sizes": False, "seed": False, "scalars": False, "ranges": False, "tolerances": False}
_ACCESS_KEYS = ("in", "out", "inout", "scalar")
_INFERENCE_KEYS = ("shapes", "inout", "in", "out", "scalars", "values")


def find_manifest(path: str | Path) -> Path:
    """Accepts the manifest file itself or the folder that holds kitdispatch.toml."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(
            f"no manifest at {path}",
            fix=f"pass a {MANIFEST_NAME} file or a folder holding one",
        )
    return path


def load_manifest(path: str | Path) -> ModuleSpec:
    path = find_manifest(path)
    try:
        data = tomllib.loads(read_regular_file(path).decode())
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"invalid TOML: {exc}", where=str(path), fix="fix the TOML syntax") from None
    except UnicodeDecodeError as exc:
        raise ManifestError(f"not UTF-8 text: {exc}", where=str(path), fix="save it as UTF-8") from None
    except FileTooLarge as exc:
        raise ManifestError(f"the manifest {exc.strerror}", where=str(path), fix="a manifest is a few kilobytes of TOML") from None
    except RecursionError:  # tomllib recurses once per level of nested arrays and tables
        raise ManifestError(
            "arrays or tables are nested too deeply to read", where=str(path), fix="a manifest needs at most a few levels of nesting"
        ) from None
    return parse_manifest(data, root=path.parent, where=str(path))


def parse_manifest(data: dict[str, Any], *, root: Path, where: str) -> ModuleSpec:
    _check_keys(data, _TOP_KEYS, where)
    name = data.get("name", _default_name(root))
    kernels = [
        _parse_kernel(k, root, f"{where}: kernels[{i}]")
        for i, k in enumerate(_list_of_tables(data["kernels"], f"{where}: kernels"))
    ]
    programs = [
        _parse_program(p, root, f"{where}: programs[{i}]")
        for i, p in enumerate(_list_of_tables(data.get("programs", []), f"{where}: programs"))
    ]
    test = _parse_test(data.get("test", {}), root, f"{where}: test")
    return ModuleSpec.create(
        name, kernels, root=root, programs=programs, test=test,
        include_dirs=data.get("include_dirs", ()), defines=data.get("defines", ()), where=where,
    )


def _default_name(root: Path) -> str:
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in root.resolve().name) or "module"
    return name if not name[0].isdigit() else f"m_{name}"


def kernel_from_source(
    name: str,
    source: str | Path,
    *,
    shapes: dict[str, str],
    workgroup_size: list[int],
    workgroup_count: list[int | str],
    inout: list[str] | tuple[str, ...] = (),
    inputs: list[str] | tuple[str, ...] = (),
    outputs: list[str] | tuple[str, ...] = (),
    scalars: dict[str, str] | None = None,
    values: dict[str, int | float | str] | None = None,
    function: str | None = None,
    format: str | None = None,
    dynamic_shared_memory: int | str = 0,
    dynamic_shared_memory_max: int | None = None,
    replaces: list[str] | None = None,
    replace_when: dict[str, Any] | None = None,
    include_dirs: list[str] | tuple[str, ...] = (),
    defines: list[str] | tuple[str, ...] = (),
    root: str | Path = ".",
) -> Kernel:
    """The Python API's twin of a manifest entry without `params`: the layout comes from the
    kernel's C signature, and the arguments say only what it cannot (shapes, which buffers
    are in place, scalar types C cannot tell). Same checks, same errors as the manifest."""
    data: dict[str, Any] = {
        "name": name,
        "source": str(source),
        "shapes": dict(shapes),
        "workgroup_size": list(workgroup_size),
        "workgroup_count": list(workgroup_count),
    }
    optional = {
        "inout": list(inout),
        "in": list(inputs),
        "out": list(outputs),
        "scalars": dict(scalars or {}),
        "values": dict(values or {}),
        "function": function,
        "format": format,
        "dynamic_shared_memory": dynamic_shared_memory,
        "dynamic_shared_memory_max": dynamic_shared_memory_max,
        "replaces": replaces,
        "replace_when": replace_when,
        "include_dirs": list(include_dirs),
        "defines": list(defines),
    }
    data.update({k: v for k, v in optional.items() if v})
    return _parse_kernel(data, Path(root), f"kernel {name!r}")


def _parse_kernel(data: dict, root: Path, where: str) -> Kernel:
    _check_keys(data, _KERNEL_KEYS, where)
    name = check_kernel_name(_string(data["name"], f"{where}: name"), f"{where}: name")
    where = f"{where} ({name})"
    source = _string(data["source"], f"{where}: source")
    sig = _signature(root / source, name, where, required="params" not in data)
    if "params" in data:
        inference = [k for k in _INFERENCE_KEYS if k in data]
        if inference:
            raise ManifestError(
                f"{', '.join(map(repr, inference))} and 'params' both describe the parameters",
                where=where,
                fix="give either 'params' (every C parameter) or 'shapes' (and inout, in, scalars, values)",
            )
        params = [
            _parse_param(p, f"{where}: params[{i}]")
            for i, p in enumerate(_list_of_tables(data["params"], f"{where}: params"))
        ]
        if sig is not None:
            params = with_split_halves(tuple(params), sig)
            check_params(params, sig, where)
    else:
        params = _infer_params(data, sig, where)
    return Kernel.create(
        name,
        source,
        params,
        workgroup_size=_list(data["workgroup_size"], f"{where}: workgroup_size"),
        workgroup_count=_list(data["workgroup_count"], f"{where}: workgroup_count"),
        function=_string(data["function"], f"{where}: function") if "function" in data else None,
        format=data.get("format"),
        dynamic_shared_memory=data.get("dynamic_shared_memory", 0),
        dynamic_shared_memory_max=data.get("dynamic_shared_memory_max"),
        # A C++ kernel's entry (its mangled name) comes from the build's own compile.
        cpp_name=sig is not None and not sig.extern_c,
        replaces=_parse_replaces(data, root, where),
        include_dirs=data.get("include_dirs", ()),
        defines=data.get("defines", ()),
        where=where,
    )


def _parse_replaces(data: dict, root: Path, where: str) -> Replaces | None:
    """`replaces = ["linalg.softmax"]`, with optional limits in
    `replace_when = { multiple_of = { k = 16 }, max = { cols = 8192 }, dimension = 1 }`, and for a
    linalg.generic `pattern = "FILE.mlir"` (beside the manifest); for a matmul `epilogue = "bias_gelu_tanh"`."""
    if "replaces" not in data:
        if "replace_when" in data:
            raise ManifestError(
                "replace_when without replaces", where=where, fix='add replaces = ["linalg.softmax"] (or the op it stands in for)'
            )
        return None
    when = data.get("replace_when", {})
    _check_keys(when, _REPLACE_WHEN_KEYS, f"{where}: replace_when")
    return Replaces.create(
        data["replaces"],
        multiple_of=when.get("multiple_of"),
        max_size=when.get("max"),
        dimension=when.get("dimension"),
        pattern=root / when["pattern"] if isinstance(when.get("pattern"), str) else when.get("pattern"),
        when=when.get("when"),
        arithmetic=when.get("arithmetic"),
        mask=when.get("mask"),
        epilogue=when.get("epilogue"),
        where=f"{where}: replaces",
    )


def _signature(path: Path, name: str, where: str, *, required: bool) -> KernelSignature | None:
    """The kernel's C signature from its source. Explicit params are only cross-checked when
    the source can be read and the kernel found in it (otherwise the compiler, or the check of
    the compiled object's entries, reports the problem with its own, better, message)."""
    try:
        text = read_regular_file(path).decode()
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        if not required and not isinstance(exc, NotRegularFile):
            return None
        raise ManifestError(
            f"cannot read kernel source {path}: {getattr(exc, 'strerror', None) or exc}",
            where=where,
            fix="point 'source' at a regular .cu file (relative to the manifest), or declare every parameter in 'params'",
        ) from None
    try:
        return find_kernel(text, cpp_base_name(name), path=str(path))
    except ManifestError:
        if required:
            raise
        return None  # explicit params: the compiler and the PTX check report what is wrong


def _infer_params(data: dict, sig: KernelSignature | None, where: str) -> tuple[Param, ...]:
    assert sig is not None
    shapes = _table(data.get("shapes", {}), f"{where}: shapes")
    scalars = _table(data.get("scalars", {}), f"{where}: scalars")
    values = _table(data.get("values", {}), f"{where}: values")
    types = {k: _string(v, f"{where}: scalars.{k}") for k, v in scalars.items()}
    c_types = {c.name: row.name for c in sig.params if (row := abi.BY_C_NAME.get(c.base_type)) and not c.is_pointer}
    return infer_params(
        sig,
        shapes={k: TensorType.parse(v, f"{where}: shapes.{k}") for k, v in shapes.items()},
        inout=tuple(_names(data.get("inout", []), f"{where}: inout")),
        inputs=tuple(_names(data.get("in", []), f"{where}: in")),
        outputs=tuple(_names(data.get("out", []), f"{where}: out")),
        scalars=types,
        values={k: _inferred_value(k, v, types.get(k) or c_types.get(k), f"{where}: values.{k}") for k, v in values.items()},
        where=where,
    )


def _inferred_value(name: str, value: Any, dtype: str | None, where: str) -> IndexExpr | float | None:
    """A `values` entry; where its type is known here, range-checked here, so that the error
    names the `values` key rather than the inferred parameter's index."""
    parsed = _parse_scalar_value(value, dtype or "i32", where)
    row = abi.find(dtype)
    if row is not None and row.kind != "struct":
        check_scalar_value(Scalar(name, row.name, parsed), row, where)
    return parsed


def _table(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise ManifestError(f"expected a table, got {value!r}", where=where, fix='e.g. { x = "f32[n]" }')
    return value


def _names(value: Any, where: str) -> list[str]:
    return [_string(v, where) for v in _list(value, where)]


def _parse_param(data: dict, where: str) -> Param:
    kinds = [k for k in _ACCESS_KEYS if k in data]
    allowed = {"name": True, **{k: False for k in _ACCESS_KEYS}, "value": False}
    _check_keys(data, allowed, where)
    if len(kinds) != 1:
        raise ManifestError(
            f"a parameter needs exactly one of {', '.join(_ACCESS_KEYS)}; found {kinds or 'none'}",
            where=where,
            fix="e.g. { name = \"x\", in = \"f32[n]\" } or { name = \"n\", scalar = \"i32\" }",
        )
    name = check_identifier(data["name"], "parameter name", where)
    kind = kinds[0]
    if kind == "scalar":
        parse_value_type(_string(data["scalar"], f"{where}: scalar"), f"{where}: scalar")  # a typo says which types exist
    if kind != "scalar":
        if "value" in data:
            raise ManifestError(
                "only scalar parameters take 'value'", where=where, fix="remove 'value' from this buffer"
            )
        return Buffer(name, kind, TensorType.parse(data[kind], where))
    dtype = _string(data["scalar"], f"{where}: scalar")
    return Scalar(name, dtype, _parse_scalar_value(data.get("value"), dtype, where))


def _parse_scalar_value(value: Any, dtype: str, where: str) -> IndexExpr | float | None:
    if value is None:
        return None
    if abi.BY_NAME.get(dtype) is not None and abi.lookup(dtype).kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ManifestError(
                f"value {value!r} of an {dtype} scalar is not a number", where=where, fix="e.g. value = 0.5"
            )
        return float(value)
    if dtype == "bool" and isinstance(value, bool):
        return IndexExpr.parse(int(value), f"{where}: value")
    return IndexExpr.parse(value, f"{where}: value")


def _parse_program(data: dict, root: Path, where: str) -> Program:
    _check_keys(data, _PROGRAM_KEYS, where)
    functions = []
    for i, f in enumerate(_list_of_tables(data["functions"], f"{where}: functions")):
        fwhere = f"{where}: functions[{i}]"
        _check_keys(f, _FUNCTION_KEYS, fwhere)
        functions.append(
            FunctionSignature(
                check_identifier(f["name"], "function name", fwhere),
                tuple(parse_value_type(a, f"{fwhere}: args") for a in _list(f["args"], f"{fwhere}: args")),
                tuple(
                    parse_value_type(r, f"{fwhere}: results")
                    for r in _list(f["results"], f"{fwhere}: results")
                ),
            )
        )
    return Program(Path(_string(data["source"], f"{where}: source")), tuple(functions))


def _parse_test(data: Any, root: Path, where: str) -> TestSpec:
    if not isinstance(data, dict):
        raise ManifestError("[test] must be a table", where=where, fix="write it as [test]")
    _check_keys(data, _TEST_KEYS, where)
    sizes = data.get("sizes", {})
    if not isinstance(sizes, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes.values()
    ):
        raise ManifestError(
            "sizes must map dimension names to positive integers", where=where, fix="e.g. sizes = { n = 1000 }"
        )
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:  # numpy's generators take no negative seed
        raise ManifestError(f"seed must be a non-negative integer, got {seed!r}", where=where, fix="e.g. seed = 0")
    scalars = data.get("scalars", {})
    if not isinstance(scalars, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in scalars.values()):
        raise ManifestError(
            "scalars must map scalar argument names to numbers", where=where, fix="e.g. scalars = { alpha = 2.5, k = 3 }"
        )
    reference = data.get("reference")
    return TestSpec(
        Path(_string(reference, f"{where}: reference")) if reference is not None else None,
        tuple(sorted((check_identifier(k, "dimension", where), v) for k, v in sizes.items())),
        seed,
        tuple(sorted((check_identifier(k, "scalar", where), v) for k, v in scalars.items())),
        _named_table(data.get("ranges", {}), InputRange.create, "ranges", "argument", where),
        _named_table(data.get("tolerances", {}), Tolerance.create, "tolerances", "function", where),
    )


def _named_table(table: Any, parse: Callable[[Any, str], object], key: str, what: str, where: str) -> tuple:
    """`{ name = value, ... }` as sorted (name, parse(value)) pairs."""
    if not isinstance(table, dict):
        raise ManifestError(f"{key} must be a table of {what} names", where=f"{where}: {key}", fix='e.g. ranges = { idx = [0, "V"] }')
    return tuple(sorted((check_identifier(k, what, f"{where}: {key}"), parse(v, f"{where}: {key}.{k}")) for k, v in table.items()))


# ---------------------------------------------------------------------------- helpers


def _check_keys(data: Any, allowed: dict[str, bool], where: str) -> None:
    if not isinstance(data, dict):
        raise ManifestError(f"expected a table, got {type(data).__name__}", where=where, fix="see the README's manifest example")
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ManifestError(
            f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}",
            where=where,
            fix=f"allowed keys here: {', '.join(allowed)}",
        )
    missing = [k for k, required in allowed.items() if required and k not in data]
    if missing:
        raise ManifestError(
            f"missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}",
            where=where,
            fix="add it; see the README's manifest example",
        )


def _list_of_tables(value: Any, where: str) -> list[dict]:
    items = _list(value, where)
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ManifestError(
                f"entry {i} is a {type(item).__name__}, not a table", where=where, fix="use { key = value } tables"
            )
    return items


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise ManifestError(f"expected a list, got {value!r}", where=where, fix="use [ ... ]")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ManifestError(f"expected a non-empty string, got {value!r}", where=where, fix="quote the value")
    return value
