"""The TOML manifest: the same kernel descriptions as the Python API, kept next to the kernels."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from .errors import ManifestError
from .spec import (
    Buffer,
    FunctionSignature,
    IndexExpr,
    Kernel,
    ModuleSpec,
    Param,
    Program,
    Scalar,
    TensorType,
    TestSpec,
    check_identifier,
    parse_value_type,
)

MANIFEST_NAME = "kitdispatch.toml"

_TOP_KEYS = {"name": False, "kernels": True, "programs": False, "test": False}
_KERNEL_KEYS = {
    "name": True,
    "source": True,
    "params": True,
    "workgroup_size": True,
    "workgroup_count": True,
    "function": False,
    "format": False,
}
_PROGRAM_KEYS = {"source": True, "functions": True}
_FUNCTION_KEYS = {"name": True, "args": True, "results": True}
_TEST_KEYS = {"reference": False, "sizes": False, "seed": False}
_ACCESS_KEYS = ("in", "out", "inout", "scalar")


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
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"invalid TOML: {exc}", where=str(path), fix="fix the TOML syntax") from None
    except UnicodeDecodeError as exc:
        raise ManifestError(f"not UTF-8 text: {exc}", where=str(path), fix="save it as UTF-8") from None
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
    return ModuleSpec.create(name, kernels, root=root, programs=programs, test=test, where=where)


def _default_name(root: Path) -> str:
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in root.resolve().name) or "module"
    return name if not name[0].isdigit() else f"m_{name}"


def _parse_kernel(data: dict, root: Path, where: str) -> Kernel:
    _check_keys(data, _KERNEL_KEYS, where)
    name = _string(data["name"], f"{where}: name")
    where = f"{where} ({name})"
    params = [
        _parse_param(p, f"{where}: params[{i}]")
        for i, p in enumerate(_list_of_tables(data["params"], f"{where}: params"))
    ]
    return Kernel.create(
        name,
        _string(data["source"], f"{where}: source"),
        params,
        workgroup_size=_list(data["workgroup_size"], f"{where}: workgroup_size"),
        workgroup_count=_list(data["workgroup_count"], f"{where}: workgroup_count"),
        function=data.get("function"),
        format=data.get("format"),
        where=where,
    )


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
    if dtype == "f32":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ManifestError(
                f"value {value!r} of an f32 scalar is not a number", where=where, fix="e.g. value = 0.5"
            )
        return float(value)
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
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ManifestError("seed must be an integer", where=where, fix="e.g. seed = 0")
    reference = data.get("reference")
    return TestSpec(
        Path(_string(reference, f"{where}: reference")) if reference is not None else None,
        tuple(sorted((check_identifier(k, "dimension", where), v) for k, v in sizes.items())),
        seed,
    )


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
